"""The gRPC services' message definitions: the committed descriptor set is what protoc makes of
gateway/grpc/protos/, and every message and call the gateway serves is the same on the wire as
in the clients that call it (tritonclient.grpc's stubs, tensorflow-serving-api's): the same full
names, field numbers, types and cardinalities, and the same method paths."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from gateway.grpc import messages, regenerate
from gateway.grpc.descriptors import FILE_DESCRIPTOR_SET


def test_the_committed_descriptor_set_is_what_the_protos_compile_to() -> None:
    assert regenerate.descriptor_set() == FILE_DESCRIPTOR_SET, (
        "gateway/grpc/descriptors.py is stale: run python -m gateway.grpc.regenerate"
    )
    expected = regenerate.render(FILE_DESCRIPTOR_SET)
    assert regenerate.TARGET.read_text(encoding="utf-8") == expected


def _field_shape(field: FieldDescriptor) -> tuple[Any, ...]:
    target = field.message_type or field.enum_type
    return (
        field.number,
        field.type,
        field.is_repeated,
        target.full_name if target is not None else None,
    )  # a oneof changes no byte on the wire: TensorInfo.name is in one in TF's, not here


def _assert_same_wire(ours: Descriptor, theirs: Descriptor, seen: set[str]) -> None:
    """Every field of ours is in theirs with the same number and type (theirs may have more,
    which is how KServe's InferParameter relates to Triton's); nested messages alike."""
    if ours.full_name in seen:
        return
    seen.add(ours.full_name)
    assert ours.full_name == theirs.full_name
    for field in ours.fields:
        other = theirs.fields_by_name.get(field.name)
        assert other is not None, f"{ours.full_name}.{field.name} is not in the client's"
        assert _field_shape(field) == _field_shape(other), f"{ours.full_name}.{field.name}"
        if field.message_type is not None:
            assert other.message_type is not None
            _assert_same_wire(field.message_type, other.message_type, seen)


def _our(full_name: str) -> Descriptor:
    return messages.POOL.FindMessageTypeByName(full_name)


def test_open_inference_protocol_messages_and_paths_match_tritonclient() -> None:
    from tritonclient.grpc import service_pb2

    theirs = service_pb2.DESCRIPTOR
    service = theirs.services_by_name["GRPCInferenceService"]
    assert service.full_name == messages.OIP
    ours = messages.POOL.FindServiceByName(messages.OIP)
    extensions = messages.POOL.FindServiceByName(messages.OIP_EXTENSIONS)
    seen: set[str] = set()
    for method in [*ours.methods, *extensions.methods]:
        other = service.methods_by_name[method.name]  # Triton calls it under the same name
        assert (method.client_streaming, method.server_streaming) == (
            other.client_streaming,
            other.server_streaming,
        )
        _assert_same_wire(method.input_type, other.input_type, seen)
        _assert_same_wire(method.output_type, other.output_type, seen)
    assert {m.name for m in [*ours.methods, *extensions.methods]} == {
        "ServerLive",
        "ServerReady",
        "ModelReady",
        "ServerMetadata",
        "ModelMetadata",
        "ModelInfer",
        "ModelStreamInfer",
        "ModelConfig",
        "ModelStatistics",
        "RepositoryIndex",
        "RepositoryModelLoad",
        "RepositoryModelUnload",
    }


def test_kserve_infer_parameter_is_the_published_one() -> None:
    """KServe's InferParameter has three choices; Triton's client also sends double_param (4)
    and uint64_param (5), which the codec reads from the unknown fields."""
    fields = {f.name: f.number for f in _our("inference.InferParameter").fields}
    assert fields == {"bool_param": 1, "int64_param": 2, "string_param": 3}


@pytest.mark.slow  # imports TensorFlow (tensorflow-serving-api's messages import its protos)
@pytest.mark.parametrize(
    ("service", "methods"),
    [
        (messages.TFS_PREDICTION, {"Predict", "GetModelMetadata"}),
        (messages.TFS_MODEL, {"GetModelStatus"}),
    ],
)
def test_tf_serving_messages_and_paths_match_tensorflow_serving_api(
    service: str, methods: set[str]
) -> None:
    from tensorflow_serving.apis import model_service_pb2, prediction_service_pb2

    module = prediction_service_pb2 if service == messages.TFS_PREDICTION else model_service_pb2
    theirs = module.DESCRIPTOR.services_by_name[service.rsplit(".", 1)[1]]
    ours = messages.POOL.FindServiceByName(service)
    assert {m.name for m in ours.methods} == methods
    seen: set[str] = set()
    for method in ours.methods:
        other = theirs.methods_by_name[method.name]
        _assert_same_wire(method.input_type, other.input_type, seen)
        _assert_same_wire(method.output_type, other.output_type, seen)
    # GetModelMetadata's answer is packed in an Any: its type URL names this message.
    from tensorflow_serving.apis import get_model_metadata_pb2

    _assert_same_wire(
        _our("tensorflow.serving.SignatureDefMap"),
        get_model_metadata_pb2.SignatureDefMap.DESCRIPTOR,
        seen,
    )


@pytest.mark.slow  # imports TensorFlow
def test_tensorflow_data_types_have_the_published_numbers() -> None:
    from tensorflow.core.framework import types_pb2

    ours = messages.POOL.FindEnumTypeByName("tensorflow.DataType")
    theirs = {v.name: v.number for v in types_pb2.DataType.DESCRIPTOR.values}
    assert {v.name: v.number for v in ours.values}.items() <= theirs.items()


def test_a_malformed_message_parses_to_a_refusal_not_an_exception() -> None:
    parse = messages.parser("inference.ModelInferRequest")
    assert isinstance(parse(b"\x0a\xff\xff\xff\xff\x0f"), messages.Malformed)  # length lies
    assert parse(b"\x0a\x01x").model_name == "x"
