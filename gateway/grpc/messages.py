"""The message classes of every served ``.proto`` file, built at import from the committed
descriptor set (``gateway.grpc.descriptors``) in a descriptor pool of their own.

A private pool because the same full names live elsewhere in a gateway's process: TensorFlow
(the TF backend) registers ``tensorflow.TensorProto`` and the rest of its protos in protobuf's
default pool, and a second definition there is refused at import. In this pool the names are
exactly the published ones, which is what reflection shows and what ``Any`` type URLs carry.
The health and reflection services' own files are copied in too, so that reflection describes
every service the server has.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2

from gateway.grpc.descriptors import FILE_DESCRIPTOR_SET

POOL = descriptor_pool.DescriptorPool()


def _load() -> None:
    files = descriptor_pb2.FileDescriptorSet.FromString(FILE_DESCRIPTOR_SET)
    for proto in files.file:  # protoc lists each file after its imports
        POOL.Add(proto)
    for module in (health_pb2, reflection_pb2):
        copied = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(copied)
        POOL.Add(copied)


_load()


def message(full_name: str) -> Any:
    """The class of a message of the pool (``Any``: built at run time, no stubs to check)."""
    return message_factory.GetMessageClass(POOL.FindMessageTypeByName(full_name))


def enum_value(enum: str, name: str) -> int:
    return int(POOL.FindEnumTypeByName(enum).values_by_name[name].number)


OIP = "inference.GRPCInferenceService"
OIP_EXTENSIONS = "inference.GRPCInferenceServiceExtensions"
TFS_PREDICTION = "tensorflow.serving.PredictionService"
TFS_MODEL = "tensorflow.serving.ModelService"
HEALTH = "grpc.health.v1.Health"
REFLECTION = "grpc.reflection.v1alpha.ServerReflection"


class Malformed:
    """What a request's bytes parse to when they are not a valid message: the handler refuses
    it with INVALID_ARGUMENT (grpc would answer INTERNAL for a deserializer's exception, a
    server fault, where the fault is the client's)."""

    def __init__(self, why: str) -> None:
        self.why = why


def parser(full_name: str) -> Callable[[bytes], Any]:
    parse = message(full_name).FromString

    def parse_or_refuse(data: bytes) -> Any:
        try:
            return parse(data)
        except DecodeError as exc:
            return Malformed(f"the request is not a valid {full_name} message: {exc}")

    return parse_or_refuse
