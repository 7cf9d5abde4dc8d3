"""The live dashboard: a page shipped inside the package (``gateway/static``, no CDN, so it works
offline) at ``/dashboard``, and the one JSON document it polls, ``/admin/dashboard.json``.

The document is built from the service's own window statistics (``ModelHost.stats``), the
metric objects in memory and the tuner's snapshots, never by parsing ``/metrics``. It lives under
``/admin/`` so that the admin token guards it like every other operator endpoint; the page itself
holds no data and is open, and asks for the token when the document answers 401.
"""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from importlib import resources
from typing import Any

from aiohttp import web
from prometheus_client.metrics import MetricWrapperBase

from gateway import __version__
from gateway.errors import BadRequest
from gateway.lifecycle import Readiness
from gateway.service import InferenceService
from gateway.tuning import TuningService

_ASSETS = {
    "dashboard.html": "text/html",
    "dashboard.js": "text/javascript",
    "dashboard.css": "text/css",
}
DATA_PATH = "/admin/dashboard.json"
_DECISIONS = 8  # the tuner's latest decisions shown per model
_ESTIMATES = 50  # estimates searched for a decision's predicted objective
HISTORY_S = 60  # seconds of each model's trend


def add_routes(
    app: web.Application,
    *,
    service: InferenceService,
    readiness: Readiness,
    tuning: TuningService | None,
) -> None:
    """``/dashboard`` (the page), ``/dashboard/<asset>`` and ``/admin/dashboard.json``."""
    static = resources.files("gateway") / "static"
    assets = {name: (static / name).read_bytes() for name in _ASSETS}  # a few kB, read once

    async def page(request: web.Request) -> web.Response:
        return web.Response(body=assets["dashboard.html"], content_type="text/html")

    async def asset(request: web.Request) -> web.Response:
        name = request.match_info["asset"]
        if name not in assets:
            raise web.HTTPNotFound()
        return web.Response(body=assets[name], content_type=_ASSETS[name])

    async def data(request: web.Request) -> web.Response:
        window_s = _window(request)
        doc = snapshot(service, readiness, tuning, window_s=window_s)
        return web.Response(
            body=json.dumps(_finite(doc)).encode(),
            content_type="application/json",
            headers={"Cache-Control": "no-store"},
        )

    async def with_slash(request: web.Request) -> web.Response:
        # The page loads its assets relative to /dashboard; under /dashboard/ they would miss.
        raise web.HTTPFound("../dashboard")

    app.router.add_get("/dashboard", page)
    app.router.add_get("/dashboard/", with_slash)
    app.router.add_get("/dashboard/{asset}", asset)
    app.router.add_get(DATA_PATH, data)


def _window(request: web.Request) -> float:
    try:
        window_s = float(request.query.get("window_s", "10"))
    except ValueError:
        raise BadRequest("window_s must be a number of seconds") from None
    if not 0 < window_s <= 3600:
        raise BadRequest("window_s must be in (0, 3600]")
    return window_s


def snapshot(
    service: InferenceService,
    readiness: Readiness,
    tuning: TuningService | None,
    *,
    window_s: float = 10.0,
) -> dict[str, Any]:
    """Everything the page shows, at this moment."""
    errors = _error_replies(service)
    models = _models(service, window_s)
    return {
        "gateway": {
            "version": __version__,
            "time": time.time(),
            "window_s": window_s,
            "ready": readiness.ready,
            "waiting_for": readiness.waiting_for(),
        },
        "models": models,
        "totals": _totals(models, window_s),
        "mqtt": _mqtt(service, errors.get("mqtt", {})),
        "grpc": _grpc(service, _requests(service, "grpc"), errors.get("grpc", {})),
        "tuner": _tuner(tuning),
        "error_replies": errors,
    }


def _models(service: InferenceService, window_s: float) -> list[dict[str, Any]]:
    """Every model version, the busiest first (by rate), then those not serving (something to
    look at), then the idle ones by name: an operator reads the top of the list at a glance."""
    return sorted(_entries(service, window_s), key=_busy_first)


def _busy_first(entry: dict[str, Any]) -> tuple[float, int, str, str]:
    stats = entry.get("stats")
    rate = stats["rate_per_s"] + stats["arrived"] / stats["window_s"] if stats else 0.0
    return (-rate, 0 if entry["state"] != "READY" else 1, entry["name"], entry["version"])


def _totals(models: list[dict[str, Any]], window_s: float) -> dict[str, Any]:
    """The gateway's sums over the window (latencies do not add up: the page shows them per
    model only)."""
    stats = [m["stats"] for m in models if "stats" in m]
    keys = ("completed", "arrived", "rejected", "slo_violations", "queue_depth", "in_system")
    out: dict[str, Any] = {key: sum(s[key] for s in stats) for key in keys}
    out["rate_per_s"] = out["completed"] / window_s
    out["models"] = len(models)
    out["serving"] = len(stats)
    out["busy"] = sum(1 for s in stats if s["completed"] or s["arrived"])
    return out


def _entries(service: InferenceService, window_s: float) -> list[dict[str, Any]]:
    batches = _batches(service)
    out: list[dict[str, Any]] = []
    for status in service.registry.statuses():
        entry: dict[str, Any] = {
            "name": status.name,
            "version": str(status.version),
            "state": status.state,
            "reason": status.reason,
        }
        if status.state == "READY":
            view = service.registry.describe(status.name, status.version)
            stats = service.stats(status.name, status.version, window_s)
            entry["backend"] = view.runtime
            entry["slo_ms"] = view.slo_ms
            entry["knobs"] = view.knobs.as_dict()
            entry["stats"] = {name: getattr(stats, name) for name in stats.__slots__}
            entry["batches"] = batches.get((status.name, str(status.version)), _no_batches())
            # Requests answered in each of the last seconds: the page's trend from its first
            # load, not only from what it polled itself.
            host = service.registry.host(status.name, status.version)
            entry["history_per_s"] = host.completions_per_second(HISTORY_S)
        out.append(entry)
    return out


def _no_batches() -> dict[str, Any]:
    return {"count": 0, "rows": 0.0, "buckets": []}


def _batches(service: InferenceService) -> dict[tuple[str, str], dict[str, Any]]:
    """Per (model, version): batches run, rows in them, and the cumulative rows histogram
    ([upper bound, batches at or below it], +Inf as null), since the gateway started."""
    found: dict[tuple[str, str], dict[str, Any]] = defaultdict(_no_batches)
    for name, labels, value in _samples(service.metrics.batch_size):
        entry = found[(labels["model"], labels["version"])]
        if name.endswith("_count"):
            entry["count"] = int(value)
        elif name.endswith("_sum"):
            entry["rows"] = value
        elif name.endswith("_bucket"):
            bound = float(labels["le"])
            entry["buckets"].append([bound if math.isfinite(bound) else None, int(value)])
    return dict(found)


def _error_replies(service: InferenceService) -> dict[str, dict[str, int]]:
    """Error replies so far, by transport and reason."""
    out: dict[str, dict[str, int]] = defaultdict(dict)
    for _, labels, value in _samples(service.metrics.error_replies):
        out[labels["transport"]][labels["reason"]] = int(value)
    return dict(out)


def _requests(service: InferenceService, transport: str) -> dict[str, int]:
    """Requests over ``transport`` so far, by outcome, over every model."""
    out: dict[str, int] = defaultdict(int)
    for name, labels, value in _samples(service.metrics.requests):
        if name.endswith("_total") and labels["transport"] == transport:
            out[labels["outcome"]] += int(value)
    return dict(out)


def _grpc(
    service: InferenceService, requests: dict[str, int], rejections: dict[str, int]
) -> dict[str, Any] | None:
    """None when the gateway serves no gRPC (its server labels ``iotgw_grpc_listening`` with
    its address once it listens). ``requests`` and ``rejections`` count since the start, as
    the MQTT block's do: the page derives the recent rate from two polls."""
    m = service.metrics
    servers = [(labels, value) for _, labels, value in _samples(m.grpc_listening)]
    if not servers:
        return None
    labels, listening = servers[0]  # one server per gateway
    return {
        "address": labels["address"],
        "tls": labels["scheme"] == "grpcs",
        "listening": listening == 1.0,
        "in_flight": int(_value(m.grpc_in_flight)),
        "streams": int(_value(m.grpc_streams)),
        "requests": sum(requests.values()),
        "ok": requests.get("ok", 0),
        "rejections": rejections,
    }


def _mqtt(service: InferenceService, rejections: dict[str, int]) -> dict[str, Any] | None:
    """None when the gateway runs no MQTT adapter (it labels ``iotgw_mqtt_connected`` with its
    broker once it starts)."""
    m = service.metrics
    brokers = [
        {"broker": labels["broker"], "connected": value == 1.0}
        for _, labels, value in _samples(m.mqtt_connected)
    ]
    if not brokers:
        return None
    return {
        "brokers": brokers,
        "connected": all(b["connected"] for b in brokers),
        "in_flight": int(_value(m.mqtt_in_flight)),
        "backlog": int(_value(m.mqtt_backlog)),
        "reconnects": int(_value(m.mqtt_reconnects)),
        "duplicates": int(_value(m.mqtt_duplicates)),
        "rejections": rejections,
    }


def _tuner(tuning: TuningService | None) -> dict[str, Any]:
    if tuning is None:
        return {"enabled": False, "models": {}}
    models: dict[str, Any] = {}
    for name, agent in sorted(tuning.agents.items()):
        snap = agent.snapshot(decisions=_DECISIONS, estimates=_ESTIMATES)
        predicted = {_config_key(e["config"]): e["objective"] for e in snap["estimates"]}
        keep = ("objective", "slo_ms", "paused", "workload", "rate_per_s", "current", "best")
        models[name] = {key: snap.get(key) for key in keep}
        models[name]["best_estimate"] = snap.get("best_estimate")
        models[name]["decision_counts"] = snap.get("decision_counts", {})
        # Newest first; ``predicted`` is the tuner's current estimate of the objective of the
        # configuration that ran (None when it holds none), next to what was measured.
        models[name]["decisions"] = [
            {**d, "predicted": predicted.get(_config_key(d["config"]))}
            for d in reversed(snap["decisions"])
        ]
    s = tuning.settings
    return {"enabled": True, "algorithm": s.algorithm, "objective": s.objective, "models": models}


def _config_key(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True)


def _samples(metric: MetricWrapperBase) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, s.labels, s.value) for family in metric.collect() for s in family.samples]


def _value(metric: MetricWrapperBase) -> float:
    """The value of an unlabelled gauge or counter (its ``_total`` sample for a counter)."""
    for name, _, value in _samples(metric):
        if not name.endswith("_created"):
            return value
    return 0.0


def _finite(doc: Any) -> Any:
    """NaN and infinities (an estimate not made yet) as null: JSON has no spelling for them."""
    if isinstance(doc, float):
        return doc if math.isfinite(doc) else None
    if isinstance(doc, dict):
        return {key: _finite(value) for key, value in doc.items()}
    if isinstance(doc, list | tuple):
        return [_finite(value) for value in doc]
    return doc
