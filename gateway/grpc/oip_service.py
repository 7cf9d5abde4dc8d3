"""``inference.GRPCInferenceService``: KServe's calls, and Triton's ModelStreamInfer and model
repository calls at the same service name (and at ``GRPCInferenceServiceExtensions``, the name
reflection describes them by). Each handler translates only; refusals become status codes in
``guarded`` (``gateway.grpc.status``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from typing import Any, TypeVar

import grpc
import numpy as np
from google.protobuf import json_format

from gateway import __version__
from gateway.codecs.datatypes import dtype_label
from gateway.edge import Edge
from gateway.errors import BadRequest, GatewayError, ModelUnavailable
from gateway.grpc import messages, oip_codec
from gateway.grpc.status import DeadlinePassed, status_code, trailers
from gateway.inference_stats import report
from gateway.lifecycle import Readiness
from gateway.model_loading import load_model
from gateway.service import InferenceService

log = logging.getLogger("gateway.grpc")

TRANSPORT = "grpc"
_T = TypeVar("_T")
# grpc.aio.ServicerContext (grpcio ships no type information)
Context = Any

_M = messages.message
_ServerLiveResponse = _M("inference.ServerLiveResponse")
_ServerReadyResponse = _M("inference.ServerReadyResponse")
_ModelReadyResponse = _M("inference.ModelReadyResponse")
_ServerMetadataResponse = _M("inference.ServerMetadataResponse")
_ModelMetadataResponse = _M("inference.ModelMetadataResponse")
_ModelStreamInferResponse = _M("inference.ModelStreamInferResponse")
_RepositoryIndexResponse = _M("inference.RepositoryIndexResponse")
_RepositoryModelLoadResponse = _M("inference.RepositoryModelLoadResponse")
_RepositoryModelUnloadResponse = _M("inference.RepositoryModelUnloadResponse")
_ModelConfigResponse = _M("inference.ModelConfigResponse")
_ModelStatisticsResponse = _M("inference.ModelStatisticsResponse")


def _triton_type(dtype: str) -> str:
    """Triton's DataType name of a numpy dtype (BYTES is its TYPE_STRING)."""
    label = dtype_label(np.dtype(dtype))
    return "TYPE_STRING" if label == "BYTES" else f"TYPE_{label}"


async def guarded(edge: Edge, context: Context, model: str, call: Awaitable[_T]) -> _T:
    """``call``'s result, or the call aborted with the status of whatever it raised (counted
    in ``iotgw_error_replies_total{transport="grpc"}`` by the edge)."""
    try:
        return await call
    except asyncio.CancelledError:
        raise  # the client went away or its deadline passed: grpc has answered already
    except Exception as exc:
        err = edge.reject(exc, phase="infer", model=model)
        await context.abort(status_code(err), err.message, trailing_metadata=trailers(err))
        raise AssertionError("unreachable: abort raises") from None


def unary_handler(
    edge: Edge, method: Callable[[Any, Context], Awaitable[Any]], request: str, reply: Any
) -> grpc.RpcMethodHandler:
    """A unary call's handler: its request parsed (bytes that are no such message are refused
    with INVALID_ARGUMENT before ``method`` runs), its reply serialized."""

    async def call(message: Any, context: Context) -> Any:
        if isinstance(message, messages.Malformed):
            await guarded(edge, context, "", _refuse(message))
        return await method(message, context)

    return grpc.unary_unary_rpc_method_handler(
        call,
        request_deserializer=messages.parser(request),
        response_serializer=reply.SerializeToString,
    )


async def _refuse(malformed: messages.Malformed) -> None:
    raise BadRequest(malformed.why)


class InferenceServicer:
    """The calls of the Open Inference Protocol service, on the gateway's service."""

    def __init__(
        self,
        *,
        service: InferenceService,
        edge: Edge,
        readiness: Readiness,
        executor: Executor,
        stream_max_in_flight: int,
        in_flight: Callable[[], Any],
    ) -> None:
        self.service = service
        self.edge = edge
        self.readiness = readiness
        self._executor = executor
        self._stream_limit = stream_max_in_flight
        # A context manager per request: the server's drain waits until none is open.
        self._in_flight = in_flight
        # A stream holds its call open between requests, where no request is in flight: only
        # this count shows a client that keeps one (iotgw_grpc_streams, the dashboard).
        self.open_streams = 0

    # -- health and metadata ---------------------------------------------------------------

    async def ServerLive(self, request: Any, context: Context) -> Any:
        return _ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Context) -> Any:
        return _ServerReadyResponse(ready=self.readiness.ready)

    async def ModelReady(self, request: Any, context: Context) -> Any:
        try:
            view = self.service.registry.describe(request.name, request.version or None)
        except GatewayError:
            return _ModelReadyResponse(ready=False)  # a probe's question has an answer: no
        return _ModelReadyResponse(ready=view.ready)

    async def ServerMetadata(self, request: Any, context: Context) -> Any:
        return _ServerMetadataResponse(
            name="iotgw", version=__version__, extensions=["model_repository", "parameters"]
        )

    async def ModelMetadata(self, request: Any, context: Context) -> Any:
        return await guarded(self.edge, context, request.name, self._metadata(request))

    async def _metadata(self, request: Any) -> Any:
        version = request.version or None
        view = self.service.registry.describe(request.name, version)
        md = self.service.metadata(request.name, version)
        reply = _ModelMetadataResponse(
            name=md.name, versions=[str(v) for v in view.versions], platform=md.platform
        )
        for spec, into in ((md.inputs, reply.inputs), (md.outputs, reply.outputs)):
            for t in spec:
                into.add(name=t.name, datatype=dtype_label(np.dtype(t.dtype)), shape=t.shape)
        return reply

    async def ModelConfig(self, request: Any, context: Context) -> Any:
        return await guarded(self.edge, context, request.name, self._config(request))

    async def _config(self, request: Any) -> Any:
        """What ``/v2/models/{m}/config`` says, as Triton's ModelConfig: the knobs as its
        dynamic batcher's and instance group's, the threads as parameters."""
        view = self.service.registry.describe(request.name, request.version or None)
        md = self.service.metadata(request.name, request.version or None)
        reply = _ModelConfigResponse()
        config, knobs = reply.config, view.knobs
        config.name, config.platform = view.name, md.platform
        config.backend = md.platform.split("_")[0]  # onnxruntime, tensorflow
        config.max_batch_size = view.max_batch_size
        batched = view.max_batch_size > 0
        for spec, into in ((md.inputs, config.input), (md.outputs, config.output)):
            for t in spec:
                dims = t.shape[1:] if batched and t.shape else t.shape
                into.add(name=t.name, data_type=_triton_type(t.dtype), dims=dims)
        batching = config.dynamic_batching
        batching.preferred_batch_size.append(knobs.max_batch_size)
        batching.max_queue_delay_microseconds = round(knobs.batch_timeout_ms * 1000)
        config.instance_group.add(count=knobs.concurrency, kind="KIND_AUTO")
        for name, value in (
            ("intra_op_threads", knobs.intra_op_threads),
            ("inter_op_threads", knobs.inter_op_threads),
            ("slo_ms", view.slo_ms),
            ("max_queue_size", view.max_queue_size),
        ):
            config.parameters[name].string_value = f"{value:g}"
        return reply

    async def ModelStatistics(self, request: Any, context: Context) -> Any:
        return await guarded(self.edge, context, request.name, self._statistics(request))

    async def _statistics(self, request: Any) -> Any:
        doc = report(self.service.registry.statistics(request.name, request.version))
        return json_format.ParseDict(doc, _ModelStatisticsResponse())

    # -- inference -------------------------------------------------------------------------

    async def ModelInfer(self, request: Any, context: Context) -> Any:
        with self._in_flight():
            return await guarded(
                self.edge, context, request.model_name, self._infer(request, context)
            )

    async def _infer(self, request: Any, context: Context) -> Any:
        version = request.model_version or None
        self.edge.check_model(request.model_name, version)  # before any tensor is built
        remaining = context.time_remaining()
        if remaining is not None and remaining <= 0:
            raise DeadlinePassed("the call's deadline passed before the gateway read it")
        req, raw = await self.edge.run_decode(
            request.ByteSize(),
            lambda: oip_codec.decode_request(
                request, limits=self.edge.limits, deadline_s=remaining
            ),
            model=request.model_name,
        )
        response = await self.service.infer(req, transport=TRANSPORT)
        return oip_codec.encode_response(response, raw=raw)

    async def ModelStreamInfer(self, request_iterator: Any, context: Context) -> None:
        """Each request of the stream is answered on it, in completion order, its response
        carrying its id; a refused one gets ``error_message`` and the stream goes on. At most
        ``stream_max_in_flight`` run at once: the next is read only when one is answered, so
        a fast writer is held back by HTTP/2 flow control, not buffered here."""
        slots = asyncio.Semaphore(self._stream_limit)
        write_lock = asyncio.Lock()  # one write at a time on the call

        async def answer(request: Any) -> None:
            try:
                with self._in_flight():
                    reply = await self._stream_reply(request, context)
                async with write_lock:
                    await context.write(reply)
            finally:
                slots.release()

        self.open_streams += 1
        try:
            async with asyncio.TaskGroup() as tasks:
                while True:
                    await slots.acquire()
                    request = await context.read()
                    if request is grpc.aio.EOF:
                        break
                    tasks.create_task(answer(request))
        finally:
            self.open_streams -= 1

    async def _stream_reply(self, request: Any, context: Context) -> Any:
        try:
            if isinstance(request, messages.Malformed):
                raise BadRequest(request.why)
            return _ModelStreamInferResponse(infer_response=await self._infer(request, context))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            model = getattr(request, "model_name", "")  # none when it could not be parsed
            err = self.edge.reject(exc, phase="infer", model=model)
            reply = _ModelStreamInferResponse(error_message=err.message)
            reply.infer_response.model_name = model
            reply.infer_response.id = getattr(request, "id", "")
            # What a unary call's trailers say, for clients that read more than the message.
            params = reply.infer_response.parameters
            params["grpc_status"].string_param = status_code(err).name
            params["reason"].string_param = err.reason
            if err.retry_after is not None:
                params["retry_after_ms"].int64_param = max(1, round(err.retry_after * 1000))
            return reply

    # -- model repository (Triton's extension) ---------------------------------------------

    async def RepositoryIndex(self, request: Any, context: Context) -> Any:
        reply = _RepositoryIndexResponse()
        for s in self.service.registry.statuses():
            if not request.ready or s.state == "READY":
                reply.models.add(
                    name=s.name, version=str(s.version), state=s.state, reason=s.reason
                )
        return reply

    async def RepositoryModelLoad(self, request: Any, context: Context) -> Any:
        await guarded(self.edge, context, request.model_name, self._load(request.model_name))
        return _RepositoryModelLoadResponse()

    async def _load(self, model: str) -> None:
        root = self.service.registry.repository
        if root is None:
            raise ModelUnavailable("this gateway serves no model repository folder to load from")
        await load_model(self.service.registry, root, model, self._executor)

    async def RepositoryModelUnload(self, request: Any, context: Context) -> Any:
        name = request.model_name
        await guarded(self.edge, context, name, self.service.registry.unload_model(name))
        return _RepositoryModelUnloadResponse()


def method_handlers(servicer: InferenceServicer) -> dict[str, grpc.RpcMethodHandler]:
    """The handlers of every call, by method name, with the messages' (de)serializers."""

    def unary(method: Callable[..., Any], request: str, reply: Any) -> grpc.RpcMethodHandler:
        return unary_handler(servicer.edge, method, request, reply)

    s = servicer
    return {
        "ServerLive": unary(s.ServerLive, "inference.ServerLiveRequest", _ServerLiveResponse),
        "ServerReady": unary(s.ServerReady, "inference.ServerReadyRequest", _ServerReadyResponse),
        "ModelReady": unary(s.ModelReady, "inference.ModelReadyRequest", _ModelReadyResponse),
        "ServerMetadata": unary(
            s.ServerMetadata, "inference.ServerMetadataRequest", _ServerMetadataResponse
        ),
        "ModelMetadata": unary(
            s.ModelMetadata, "inference.ModelMetadataRequest", _ModelMetadataResponse
        ),
        "ModelInfer": unary(
            s.ModelInfer, "inference.ModelInferRequest", oip_codec.ModelInferResponse
        ),
        "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(
            s.ModelStreamInfer,
            request_deserializer=messages.parser("inference.ModelInferRequest"),
            response_serializer=_ModelStreamInferResponse.SerializeToString,
        ),
        "ModelConfig": unary(s.ModelConfig, "inference.ModelConfigRequest", _ModelConfigResponse),
        "ModelStatistics": unary(
            s.ModelStatistics, "inference.ModelStatisticsRequest", _ModelStatisticsResponse
        ),
        "RepositoryIndex": unary(
            s.RepositoryIndex, "inference.RepositoryIndexRequest", _RepositoryIndexResponse
        ),
        "RepositoryModelLoad": unary(
            s.RepositoryModelLoad,
            "inference.RepositoryModelLoadRequest",
            _RepositoryModelLoadResponse,
        ),
        "RepositoryModelUnload": unary(
            s.RepositoryModelUnload,
            "inference.RepositoryModelUnloadRequest",
            _RepositoryModelUnloadResponse,
        ),
    }


# The calls KServe's service declares; the rest are Triton's, described under OIP_EXTENSIONS.
KSERVE_METHODS = frozenset(
    {"ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer"}
)
