"""HTTP adapter (aiohttp): Open Inference Protocol v2, TF Serving REST, admin and metrics.

Handlers only translate between HTTP and the service; every error is a ``GatewayError`` mapped
to a status and ``{"error": "..."}`` by one middleware.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from typing import Any

import numpy as np
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from gateway import __version__
from gateway.codecs import oip, tfserving
from gateway.codecs.datatypes import dtype_label
from gateway.codecs.limits import DEFAULT_LIMITS, DecodeLimits
from gateway.core import ServingCore
from gateway.edge import Edge
from gateway.errors import BadRequest, ModelUnavailable, NotFound, PayloadTooLarge, Unauthorized
from gateway.http import dashboard, repository_api, security
from gateway.http.refusal_pace import REFUSAL_PACE_KEY, refusal_pace
from gateway.inference_stats import report
from gateway.lifecycle import Readiness, models_check
from gateway.service import InferenceService
from gateway.settings.schema import HttpSettings
from gateway.tuning import TuningService

log = logging.getLogger("gateway.http")

SERVICE_KEY = web.AppKey("service", InferenceService)
# What the inference handlers call: the service itself, or in an ingest process its stand-in.
CORE_KEY = web.AppKey("core", ServingCore)
SETTINGS_KEY = web.AppKey("settings", HttpSettings)
EXECUTOR_KEY = web.AppKey("executor", Executor)
TUNING_KEY = web.AppKey("tuning", TuningService)
READINESS_KEY = web.AppKey("readiness", Readiness)
EDGE_KEY = web.AppKey("edge", Edge)
TRANSPORT = "http"
_JSON = "application/json"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=json.dumps(body).encode(), status=status, content_type=_JSON)


def _error_response(status: int, message: str, retry_after: float | None = None) -> web.Response:
    resp = web.Response(body=oip.encode_error(message), status=status, content_type=_JSON)
    if retry_after is not None:
        resp.headers["Retry-After"] = str(max(1, round(retry_after)))
    return resp


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure ends as an error reply (the edge maps and counts it; a refusal for load
    is paced per connection); none reaches aiohttp, whose 500 page would carry a traceback."""
    try:
        return await handler(request)
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[SETTINGS_KEY].max_body_bytes
        exc: BaseException = PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")
    except web.HTTPException as http_exc:
        if http_exc.status < 400:
            raise
        message = (
            f"no route for {request.method} {request.path}"
            if http_exc.status == 404
            else http_exc.reason
        )
        return _error_response(http_exc.status, message)
    except asyncio.CancelledError:
        raise  # the client went away: there is no one to answer
    except Exception as caught:  # also RecursionError and MemoryError (both are Exceptions)
        exc = caught
    err = request.app[EDGE_KEY].reject(
        exc, phase="infer", model=request.match_info.get("model", "")
    )
    await request.app[REFUSAL_PACE_KEY].hold(request.transport, err.retry_after)
    return _error_response(err.status, err.message, err.retry_after)


async def _read_body(request: web.Request) -> bytes:
    limit = request.app[SETTINGS_KEY].max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(
            f"request body of {request.content_length} bytes exceeds the limit of {limit}"
        )
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes") from None


def _version(request: web.Request) -> str | None:
    return request.match_info.get("version")


# -- Open Inference Protocol -------------------------------------------------------------------


async def server_metadata(request: web.Request) -> web.Response:
    return _json(
        {
            "name": "iotgw",
            "version": __version__,
            "extensions": ["binary_tensor_data", "model_repository", "parameters"],
        }
    )


async def live(request: web.Request) -> web.Response:
    return _json({"live": True})


async def ready(request: web.Request) -> web.Response:
    waiting = request.app[READINESS_KEY].waiting_for()
    if not waiting:
        return _json({"ready": True})
    return _json({"ready": False, "waiting_for": waiting}, status=503)


async def model_stats(request: web.Request) -> web.Response:
    """Triton's statistics extension (``gateway.inference_stats``)."""
    model, version = request.match_info.get("model", ""), _version(request) or ""
    return _json(report(request.app[SERVICE_KEY].registry.statistics(model, version)))


async def model_metadata(request: web.Request) -> web.Response:
    service = request.app[SERVICE_KEY]
    name, version = request.match_info["model"], _version(request)
    view = service.registry.describe(name, version)
    md = service.metadata(name, version)
    return _json(
        {
            "name": md.name,
            "versions": [str(v) for v in view.versions],
            "platform": md.platform,
            "inputs": [_tensor(t.name, t.dtype, t.shape) for t in md.inputs],
            "outputs": [_tensor(t.name, t.dtype, t.shape) for t in md.outputs],
        }
    )


def _tensor(name: str, dtype: str, shape: tuple[int, ...]) -> dict[str, Any]:
    return {"name": name, "datatype": dtype_label(np.dtype(dtype)), "shape": list(shape)}


async def model_ready(request: web.Request) -> web.Response:
    view = request.app[SERVICE_KEY].registry.describe(
        request.match_info["model"], _version(request)
    )
    return _json(
        {"name": view.name, "version": str(view.version), "ready": view.ready, "state": view.state},
        status=200 if view.ready else 503,
    )


async def model_config(request: web.Request) -> web.Response:
    view = request.app[SERVICE_KEY].registry.describe(
        request.match_info["model"], _version(request)
    )
    knobs = view.knobs
    plan = view.metadata.serving_plan if view.metadata is not None else None
    return _json(
        {
            "name": view.name,
            "version": str(view.version),
            "backend": view.runtime,
            "max_batch_size": view.max_batch_size,
            "slo_ms": view.slo_ms,
            "dynamic_batching": {
                "preferred_max_batch_size": knobs.max_batch_size,
                "max_queue_delay_microseconds": round(knobs.batch_timeout_s * 1e6),
                "max_queue_size": view.max_queue_size,
            },
            "instance_group": [{"count": knobs.concurrency, "kind": "KIND_AUTO"}],
            "parameters": {
                "intra_op_threads": knobs.intra_op_threads,
                "inter_op_threads": knobs.inter_op_threads,
            },
            # How each quantized tensor runs (None for a model with no quantized weights).
            "serving_plan": plan.as_doc() if plan is not None else None,
        }
    )


async def repository_index(request: web.Request) -> web.Response:
    body = await _read_body(request)
    ready_only = False
    if body.strip():
        try:
            doc = json.loads(body)
        except json.JSONDecodeError as exc:
            raise BadRequest(f"malformed JSON: {exc}") from None
        ready_only = bool(isinstance(doc, dict) and doc.get("ready"))
    index = [
        {
            "name": s.name,
            "version": str(s.version),
            "state": s.state,
            **({"reason": s.reason} if s.reason else {}),
        }
        for s in request.app[SERVICE_KEY].registry.statuses()
        if not ready_only or s.state == "READY"
    ]
    return _json(index)


async def infer(request: web.Request) -> web.Response:
    service, edge = request.app[CORE_KEY], request.app[EDGE_KEY]
    name, version = request.match_info["model"], _version(request)
    edge.check_model(name, version)  # 404 before the body is even read
    body = await _read_body(request)
    edge.refuse_before_decoding(body, model=name, version=version)  # and 503 before decoding
    raw_len = request.headers.get(oip.HEADER_LENGTH)
    header_length: int | None = None
    if raw_len is not None:
        try:
            header_length = int(raw_len)
        except ValueError:
            raise BadRequest(f"{oip.HEADER_LENGTH} must be an integer, got {raw_len!r}") from None
    req, fmt = await edge.decode_oip(body, model=name, version=version, header_length=header_length)
    response = await service.infer(req, transport=TRANSPORT)
    payload, json_len = oip.encode_response(response, fmt)
    if json_len is None:
        return web.Response(body=payload, content_type=_JSON)
    return web.Response(
        body=payload,
        content_type="application/octet-stream",
        headers={oip.HEADER_LENGTH: str(json_len)},
    )


# -- TF Serving REST ---------------------------------------------------------------------------


async def tfs_status(request: web.Request) -> web.Response:
    service = request.app[SERVICE_KEY]
    name, version = request.match_info["model"], _version(request)
    # 404 for unknown models/versions; one that is known but unreadable gets its status below.
    with contextlib.suppress(ModelUnavailable):
        service.registry.describe(name, version)
    states = {"READY": "AVAILABLE", "LOADING": "LOADING", "UNLOADING": "UNLOADING"}
    statuses = [
        {
            "version": str(s.version),
            "state": states.get(s.state, "END"),
            "status": {
                "error_code": "OK" if s.state == "READY" else "UNAVAILABLE",
                "error_message": s.reason,
            },
        }
        for s in service.registry.statuses()
        if s.name == name and (version is None or str(s.version) == version)
    ]
    return _json({"model_version_status": statuses})


async def tfs_metadata(request: web.Request) -> web.Response:
    service = request.app[SERVICE_KEY]
    name, version = request.match_info["model"], _version(request)
    view = service.registry.describe(name, version)
    md = service.metadata(name, version)

    def info(t: Any) -> dict[str, Any]:
        return {
            "dtype": _TF_DTYPES.get(t.dtype, t.dtype),
            "tensor_shape": {
                "dim": [{"size": str(d), "name": ""} for d in t.shape],
                "unknown_rank": False,
            },
            "name": t.name,
        }

    return _json(
        {
            "model_spec": {"name": view.name, "signature_name": "", "version": str(view.version)},
            "metadata": {
                "signature_def": {
                    "signature_def": {
                        tfserving.SIGNATURE: {
                            "inputs": {t.name: info(t) for t in md.inputs},
                            "outputs": {t.name: info(t) for t in md.outputs},
                            "method_name": "tensorflow/serving/predict",
                        }
                    }
                }
            },
        }
    )


_TF_DTYPES = {
    "float32": "DT_FLOAT",
    "float64": "DT_DOUBLE",
    "float16": "DT_HALF",
    "int32": "DT_INT32",
    "int64": "DT_INT64",
    "int8": "DT_INT8",
    "uint8": "DT_UINT8",
    "int16": "DT_INT16",
    "uint16": "DT_UINT16",
    "bool": "DT_BOOL",
    "object": "DT_STRING",
}


async def tfs_predict(request: web.Request) -> web.Response:
    service, edge = request.app[CORE_KEY], request.app[EDGE_KEY]
    name, version = request.match_info["model"], _version(request)
    edge.check_model(name, version)  # 404 before the body is even read
    body = await _read_body(request)
    edge.refuse_before_decoding(body, model=name, version=version)  # and 503 before decoding
    req, rows = await edge.decode_tfs(body, model=name, version=version)
    response = await service.infer(req, transport=TRANSPORT)
    return web.Response(body=tfserving.encode_predict(response, rows=rows), content_type=_JSON)


# -- admin and metrics -------------------------------------------------------------------------


def _check_admin(request: web.Request) -> None:
    token = request.app[SETTINGS_KEY].admin_token
    if token is None:
        return
    given = request.headers.get("Authorization", "")
    if not hmac.compare_digest(given.encode(), f"Bearer {token.get_secret_value()}".encode()):
        raise Unauthorized("admin endpoints need 'Authorization: Bearer <admin token>'")


async def admin_models(request: web.Request) -> web.Response:
    _check_admin(request)
    service = request.app[SERVICE_KEY]
    out = []
    for s in service.registry.statuses():
        entry: dict[str, Any] = {"name": s.name, "version": str(s.version), "state": s.state}
        if s.state == "READY":
            entry["knobs"] = service.knobs(s.name, s.version).as_dict()
        out.append(entry)
    return _json(out)


async def admin_knobs(request: web.Request) -> web.Response:
    _check_admin(request)
    service = request.app[SERVICE_KEY]
    name, version = request.match_info["model"], _version(request)
    if request.method == "GET":
        view = service.registry.describe(name, version)
        return _json(
            {"model": view.name, "version": str(view.version), "knobs": view.knobs.as_dict()}
        )
    body = await _read_body(request)
    try:
        changes = json.loads(body)
    except json.JSONDecodeError as exc:
        raise BadRequest(f"malformed JSON: {exc}") from None
    if not isinstance(changes, dict):
        raise BadRequest("the body must be an object of knob changes")
    knobs = await service.change_knobs(name, version, changes)
    view = service.registry.describe(name, version)
    body_out: dict[str, Any] = {
        "model": view.name,
        "version": str(view.version),
        "knobs": knobs.as_dict(),
    }
    tuning = request.app.get(TUNING_KEY)
    if tuning is not None and view.name in tuning.agents:
        # An operator's explicit setting is not overridden behind their back.
        tuning.set_by_hand(view.name)
        body_out["tuner"] = "paused"
    return _json(body_out)


async def admin_tuner(request: web.Request) -> web.Response:
    """GET: the online tuner's state (every tuned model, or one with its estimates and
    decisions); PUT/POST {"paused": bool} on a model pauses or resumes its agent."""
    _check_admin(request)
    tuning = request.app.get(TUNING_KEY)
    model = request.match_info.get("model")
    if tuning is None:
        if model is not None:
            raise NotFound("the online tuner is disabled")
        return _json({"enabled": False, "models": {}})
    if model is None:
        return _json(tuning.snapshot())
    if request.method != "GET":
        try:
            doc = json.loads(await _read_body(request))
        except json.JSONDecodeError as exc:
            raise BadRequest(f"malformed JSON: {exc}") from None
        if (
            not isinstance(doc, dict)
            or set(doc) != {"paused"}
            or not isinstance(doc["paused"], bool)
        ):
            raise BadRequest('the body must be {"paused": true|false}')
        tuning.set_paused(model, doc["paused"], why="admin request")
    try:
        decisions = int(request.query.get("decisions", "50"))
        estimates = int(request.query.get("estimates", "20"))
    except ValueError:
        raise BadRequest("decisions and estimates must be integers") from None
    if not (0 <= decisions <= 1000 and 0 <= estimates <= 1000):
        raise BadRequest("decisions and estimates must be in [0, 1000]")
    return _json(tuning.agent(model).snapshot(decisions=decisions, estimates=estimates))


async def admin_stats(request: web.Request) -> web.Response:
    _check_admin(request)
    try:
        window = float(request.query.get("window_s", "10"))
    except ValueError:
        raise BadRequest("window_s must be a number of seconds") from None
    if not 0 < window <= 3600:
        raise BadRequest("window_s must be in (0, 3600]")
    stats = request.app[SERVICE_KEY].stats(request.match_info["model"], _version(request), window)
    return _json({f: getattr(stats, f) for f in stats.__slots__})


async def metrics(request: web.Request) -> web.Response:
    body = request.app[SERVICE_KEY].metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


_MODEL = "{model:[A-Za-z0-9][A-Za-z0-9_.-]*}"
_VERSION = "/versions/{version:[0-9]+}"
_OIP_MODEL_PATHS = (f"/v2/models/{_MODEL}", f"/v2/models/{_MODEL}{_VERSION}")
_TFS_MODEL_PATHS = (f"/v1/models/{_MODEL}", f"/v1/models/{_MODEL}{_VERSION}")


def add_inference_routes(router: web.UrlDispatcher) -> None:
    """The routes that carry tensors: all an ingest process serves itself."""
    for base in _OIP_MODEL_PATHS:
        router.add_post(f"{base}/infer", infer)
    for base in _TFS_MODEL_PATHS:
        router.add_post(f"{base}:predict", tfs_predict)


def build_app(
    service: InferenceService,
    settings: HttpSettings,
    executor: Executor,
    tuning: TuningService | None = None,
    limits: DecodeLimits = DEFAULT_LIMITS,
    readiness: Readiness | None = None,
) -> web.Application:
    # aiohttp's own size check is a second line behind _read_body's (chunked bodies).
    app = web.Application(client_max_size=settings.max_body_bytes, middlewares=[error_middleware])
    app[SERVICE_KEY] = service
    app[SETTINGS_KEY] = settings
    app[EXECUTOR_KEY] = executor
    if readiness is None:  # no other ingest to wait for: ready once the models are
        readiness = Readiness()
        readiness.require(models_check(service.registry))
    app[READINESS_KEY] = readiness
    app[EDGE_KEY] = Edge(service=service, executor=executor, limits=limits, transport=TRANSPORT)
    app[REFUSAL_PACE_KEY] = refusal_pace(settings, service.metrics)
    security.install(app, settings, service.metrics)  # tokens, connection cap, body deadline
    if tuning is not None:
        app[TUNING_KEY] = tuning
    app[CORE_KEY] = service
    r = app.router
    add_inference_routes(r)
    r.add_get("/v2", server_metadata)
    r.add_get("/v2/health/live", live)
    r.add_get("/v2/health/ready", ready)
    r.add_post("/v2/repository/index", repository_index)
    repository_api.add_routes(app, service.registry, executor)  # load, unload
    r.add_get("/v2/models/stats", model_stats)  # before /v2/models/{model}: every model's
    for base in _OIP_MODEL_PATHS:
        r.add_get(f"{base}/stats", model_stats)
        r.add_get(base, model_metadata)
        r.add_get(f"{base}/ready", model_ready)
        r.add_get(f"{base}/config", model_config)
    for base in _TFS_MODEL_PATHS:
        r.add_get(base, tfs_status)
        r.add_get(f"{base}/metadata", tfs_metadata)
    r.add_get("/admin/models", admin_models)
    for base in ("/admin/models/{model}", "/admin/models/{model}/versions/{version:[0-9]+}"):
        r.add_route("GET", f"{base}/knobs", admin_knobs)
        r.add_route("PUT", f"{base}/knobs", admin_knobs)
        r.add_route("POST", f"{base}/knobs", admin_knobs)
        r.add_get(f"{base}/stats", admin_stats)
    r.add_get("/admin/tuner", admin_tuner)
    for method in ("GET", "PUT", "POST"):
        r.add_route(method, "/admin/tuner/{model}", admin_tuner)
    r.add_get("/metrics", metrics)
    dashboard.add_routes(app, service=service, readiness=readiness, tuning=tuning)
    return app
