"""TF Serving's ``PredictionService`` (Predict, GetModelMetadata) and ``ModelService``
(GetModelStatus), with ``tensorflow.TensorProto`` <-> numpy as TF Serving's clients write it:
``tensor_content`` (little-endian, what ``tf.make_tensor_proto`` writes for numbers) or the
typed ``*_val`` field of the dtype, one value per element. The same limits, checks and error
codes as the Open Inference Protocol service."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import grpc
import numpy as np

from gateway.codecs import tfserving
from gateway.codecs.limits import DecodeLimits
from gateway.codecs.oip import convert_values, tensor_from_raw
from gateway.edge import Edge
from gateway.errors import BadRequest, ModelUnavailable, NotFound
from gateway.grpc import messages
from gateway.grpc.oip_service import TRANSPORT, Context, guarded, unary_handler
from gateway.grpc.status import DeadlinePassed
from gateway.service import InferenceService
from gateway.types import InferenceRequest

_M = messages.message
_PredictResponse = _M("tensorflow.serving.PredictResponse")
_GetModelMetadataResponse = _M("tensorflow.serving.GetModelMetadataResponse")
_SignatureDefMap = _M("tensorflow.serving.SignatureDefMap")
_GetModelStatusResponse = _M("tensorflow.serving.GetModelStatusResponse")

# tensorflow.DataType -> numpy, and the typed field that carries it. Other dtypes (complex,
# quantized, bfloat16, resources, variants) are refused: no served model takes them.
_DTYPES: dict[str, tuple[np.dtype, str]] = {
    "DT_FLOAT": (np.dtype(np.float32), "float_val"),
    "DT_DOUBLE": (np.dtype(np.float64), "double_val"),
    "DT_INT32": (np.dtype(np.int32), "int_val"),
    "DT_INT16": (np.dtype(np.int16), "int_val"),
    "DT_INT8": (np.dtype(np.int8), "int_val"),
    "DT_UINT8": (np.dtype(np.uint8), "int_val"),
    "DT_UINT16": (np.dtype(np.uint16), "int_val"),
    "DT_INT64": (np.dtype(np.int64), "int64_val"),
    "DT_UINT32": (np.dtype(np.uint32), "uint32_val"),
    "DT_UINT64": (np.dtype(np.uint64), "uint64_val"),
    "DT_BOOL": (np.dtype(np.bool_), "bool_val"),
    "DT_HALF": (np.dtype(np.float16), "half_val"),
    "DT_STRING": (np.dtype(object), "string_val"),
}
_ENUM = "tensorflow.DataType"
_CODE_OF = {messages.enum_value(_ENUM, name): name for name in _DTYPES}
_NUMBER_OF = {dtype.name: messages.enum_value(_ENUM, name) for name, (dtype, _) in _DTYPES.items()}
_VAL_FIELDS = frozenset(field for _, field in _DTYPES.values())
_STATE = {"READY": "AVAILABLE", "LOADING": "LOADING", "UNLOADING": "UNLOADING"}
_METHOD = "tensorflow/serving/predict"


def tensor_to_array(proto: Any, what: str, limits: DecodeLimits) -> np.ndarray:
    name = _CODE_OF.get(proto.dtype)
    if name is None:
        raise BadRequest(f"{what}: dtype {proto.dtype} is not served (numbers, bools, strings)")
    dtype, field = _DTYPES[name]
    if proto.tensor_shape.unknown_rank:
        raise BadRequest(f"{what}: a tensor's shape must be known")
    shape = [d.size for d in proto.tensor_shape.dim]
    if any(d < 0 for d in shape):
        raise BadRequest(f"{what}: shape {shape} has a negative dimension")
    count = limits.check_shape(shape, what)
    filled = {f.name for f, _ in proto.ListFields()} & _VAL_FIELDS
    if proto.tensor_content:
        if filled or name == "DT_STRING":
            raise BadRequest(f"{what}: give tensor_content or {field}, not both")
        return tensor_from_raw(proto.tensor_content, dtype, shape, what)
    if filled - {field}:
        raise BadRequest(f"{what}: {name} values go in {field}, not in {sorted(filled)[0]}")
    values = getattr(proto, field)
    if len(values) != count:
        raise BadRequest(f"{what}: {len(values)} values in {field} for shape {shape} ({count})")
    if name == "DT_STRING":
        arr = np.empty(count, dtype=object)
        arr[:] = list(values)
        return arr.reshape(shape)
    if name == "DT_HALF":  # each value's 16 bits, in an int32
        bits = convert_values(np.asarray(values), np.dtype(np.uint16), what)
        return bits.view(np.float16).reshape(shape)
    return convert_values(np.asarray(values), dtype, what).reshape(shape)


def array_to_tensor(arr: np.ndarray, into: Any) -> None:
    into.dtype = _NUMBER_OF[arr.dtype.name]
    for d in arr.shape:
        into.tensor_shape.dim.add(size=d)
    if arr.dtype.kind == "O":
        into.string_val.extend(x if isinstance(x, bytes) else str(x).encode() for x in arr.flat)
    else:
        into.tensor_content = np.ascontiguousarray(arr, arr.dtype.newbyteorder("<")).tobytes()


def _model_version(spec: Any) -> int | None:
    choice = spec.WhichOneof("version_choice")
    if choice == "version_label":
        raise NotFound(
            f"model {spec.name!r}: version labels are not served here; name a version number"
        )
    return int(spec.version.value) if choice == "version" else None


def _check_signature(spec: Any) -> None:
    if spec.signature_name not in ("", tfserving.SIGNATURE):
        raise BadRequest(
            f"unknown signature_name {spec.signature_name!r}; this model has "
            f"{tfserving.SIGNATURE!r}"
        )


class TfServingServicer:
    def __init__(
        self, *, service: InferenceService, edge: Edge, in_flight: Callable[[], Any]
    ) -> None:
        self.service = service
        self.edge = edge
        self._in_flight = in_flight

    async def Predict(self, request: Any, context: Context) -> Any:
        with self._in_flight():
            return await guarded(
                self.edge, context, request.model_spec.name, self._predict(request, context)
            )

    async def _predict(self, request: Any, context: Context) -> Any:
        spec = request.model_spec
        version = _model_version(spec)
        self.edge.check_model(spec.name, version)
        _check_signature(spec)
        remaining = context.time_remaining()
        if remaining is not None and remaining <= 0:
            raise DeadlinePassed("the call's deadline passed before the gateway read it")
        req = await self.edge.run_decode(
            request.ByteSize(),
            lambda: self._decode(request, version, remaining),
            model=spec.name,
        )
        response = await self.service.infer(req, transport=TRANSPORT)
        reply = _PredictResponse()
        reply.model_spec.name = response.model
        reply.model_spec.version.value = response.version
        reply.model_spec.signature_name = tfserving.SIGNATURE
        for name, arr in response.outputs.items():
            array_to_tensor(arr, reply.outputs[name])
        return reply

    def _decode(self, request: Any, version: int | None, remaining: float | None) -> Any:
        limits = self.edge.limits
        if not request.inputs:
            raise BadRequest("'inputs' must name at least one tensor")
        limits.check_input_count(len(request.inputs))
        limits.check_input_count(len(request.output_filter))
        inputs: dict[str, np.ndarray] = {}
        elements = 0
        for name, proto in request.inputs.items():
            inputs[name] = tensor_to_array(proto, f"input {name!r}", limits)
            elements += inputs[name].size
            limits.check_elements(elements)
        return InferenceRequest(
            model=request.model_spec.name,
            version=version,
            inputs=inputs,
            outputs=list(request.output_filter) or None,
            timeout_s=remaining,
        )

    async def GetModelMetadata(self, request: Any, context: Context) -> Any:
        return await guarded(self.edge, context, request.model_spec.name, self._metadata(request))

    async def _metadata(self, request: Any) -> Any:
        spec = request.model_spec
        version = _model_version(spec)
        _check_signature(spec)
        fields = list(request.metadata_field)
        if fields != ["signature_def"]:
            raise BadRequest(f"metadata_field must be ['signature_def'], got {fields}")
        view = self.service.registry.describe(spec.name, version)
        md = self.service.metadata(spec.name, version)
        signatures = _SignatureDefMap()
        signature = signatures.signature_def[tfserving.SIGNATURE]
        signature.method_name = _METHOD
        for tensors, into in ((md.inputs, signature.inputs), (md.outputs, signature.outputs)):
            for t in tensors:
                info = into[t.name]
                info.name = t.name
                info.dtype = _NUMBER_OF[np.dtype(t.dtype).name]
                for d in t.shape:
                    info.tensor_shape.dim.add(size=d)
        reply = _GetModelMetadataResponse()
        reply.model_spec.name = view.name
        reply.model_spec.version.value = view.version
        reply.model_spec.signature_name = tfserving.SIGNATURE
        packed = reply.metadata["signature_def"]
        packed.type_url = f"type.googleapis.com/{signatures.DESCRIPTOR.full_name}"
        packed.value = signatures.SerializeToString()
        return reply

    async def GetModelStatus(self, request: Any, context: Context) -> Any:
        return await guarded(self.edge, context, request.model_spec.name, self._status(request))

    async def _status(self, request: Any) -> Any:
        spec = request.model_spec
        version = _model_version(spec)
        with contextlib.suppress(ModelUnavailable):  # known but not ready: its state below
            self.service.registry.describe(spec.name, version)
        reply = _GetModelStatusResponse()
        for s in self.service.registry.statuses():
            if s.name != spec.name or (version is not None and s.version != version):
                continue
            entry = reply.model_version_status.add(version=s.version)
            entry.state = messages.enum_value(
                "tensorflow.serving.ModelVersionStatus.State", _STATE.get(s.state, "END")
            )
            entry.status.error_code = messages.enum_value(
                "tensorflow.error.Code", "OK" if s.state == "READY" else "UNAVAILABLE"
            )
            entry.status.error_message = s.reason
        return reply


def method_handlers(
    servicer: TfServingServicer,
) -> dict[str, dict[str, grpc.RpcMethodHandler]]:
    def unary(method: Callable[..., Any], request: str, reply: Any) -> grpc.RpcMethodHandler:
        return unary_handler(servicer.edge, method, request, reply)

    s = servicer
    return {
        messages.TFS_PREDICTION: {
            "Predict": unary(s.Predict, "tensorflow.serving.PredictRequest", _PredictResponse),
            "GetModelMetadata": unary(
                s.GetModelMetadata,
                "tensorflow.serving.GetModelMetadataRequest",
                _GetModelMetadataResponse,
            ),
        },
        messages.TFS_MODEL: {
            "GetModelStatus": unary(
                s.GetModelStatus,
                "tensorflow.serving.GetModelStatusRequest",
                _GetModelStatusResponse,
            ),
        },
    }
