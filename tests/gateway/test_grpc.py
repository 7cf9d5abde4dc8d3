"""gRPC against a real ``iotgw serve`` process, with clients written by others: tritonclient.grpc
(sync, asyncio, streaming), tensorflow-serving-api's PredictionService and ModelService stubs,
grpc.health.v1 and reflection. Outputs equal the same request over HTTP; each refusal has its
code; bad input is refused alone while other clients keep being served."""

from __future__ import annotations

import asyncio
import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
import tritonclient.grpc.aio as triton_aio
import tritonclient.http as triton_http
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from tritonclient.grpc import model_config_pb2, service_pb2
from tritonclient.utils import InferenceServerException

from tests.gateway.grpc_serve import GrpcServe, add_variant, grpc_serve
from tests.gateway.helpers import GENEROUS_TIMEOUT_US, make_repo, metric_samples

# One `iotgw serve` (ONNX Runtime and TensorFlow models) for the module: seconds to start.
pytestmark = pytest.mark.slow

MLP, MLP_TF, CNN, TINY_QUEUE = "sensor_mlp", "sensor_mlp_tf", "vision_cnn", "sensor_mlp_q1"
# Request tensors the gateway may hold at once: a 4-image vision_cnn request (48 KiB) is over it.
BUDGET = 32 * 1024
MAX_MESSAGE = 256 * 1024
SERVICES = {
    "inference.GRPCInferenceService",
    "inference.GRPCInferenceServiceExtensions",
    "tensorflow.serving.PredictionService",
    "tensorflow.serving.ModelService",
    "grpc.health.v1.Health",
    "grpc.reflection.v1alpha.ServerReflection",
}
_INFER = "/inference.GRPCInferenceService/ModelInfer"


@pytest.fixture(scope="module")
def gateway(demo_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcServe]:
    folder = tmp_path_factory.mktemp("grpc")
    repo = make_repo(folder / "repo", demo_repo, {MLP: None, MLP_TF: None, CNN: None})
    # One request queued at most, one row per batch: a burst overflows it.
    add_variant(repo, MLP, TINY_QUEUE, {"max_queue_size": 1, "max_batch_size": 1})
    args = ("--max-queued-bytes", str(BUDGET), "--grpc-max-message-bytes", str(MAX_MESSAGE))
    with grpc_serve(repo, folder, *args) as gw:
        yield gw


@pytest.fixture(scope="module")
def client(gateway: GrpcServe) -> Iterator[triton.InferenceServerClient]:
    c = triton.InferenceServerClient(gateway.target)
    yield c
    c.close()


@pytest.fixture(scope="module")
def channel(gateway: GrpcServe) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(gateway.target) as ch:
        yield ch


def _features(rows: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, 32)).astype(np.float32)


def _inputs(x: np.ndarray, name: str = "features") -> list[triton.InferInput]:
    tensor = triton.InferInput(name, list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return [tensor]


def _over_http(gateway: GrpcServe, model: str, x: np.ndarray, name: str = "features") -> Any:
    http = triton_http.InferenceServerClient(gateway.http)
    try:
        tensor = triton_http.InferInput(name, list(x.shape), "FP32")
        tensor.set_data_from_numpy(x, binary_data=True)
        return http.infer(model, [tensor])
    finally:
        http.close()


def _raw_call(channel: grpc.Channel, request: Any, timeout: float = 30) -> Any:
    call: Any = channel.unary_unary(
        _INFER,
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=service_pb2.ModelInferResponse.FromString,
    )
    return call(request, timeout=timeout)


def _refusal(call: Any) -> Any:  # a grpc.RpcError that is also a grpc.Call
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value


def _trailers(err: Any) -> dict[str, str]:
    return {k: v for k, v in (err.trailing_metadata() or ())}


# -- tritonclient.grpc: health, metadata, repository, inference ------------------------------


def test_server_and_models_answer_as_triton_asks(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.get_server_metadata().name == "iotgw"
    assert client.is_model_ready(MLP)
    assert client.is_model_ready(MLP_TF, model_version="1")
    assert not client.is_model_ready("no_such_model")
    assert not client.is_model_ready(MLP, model_version="9")
    md = client.get_model_metadata(CNN)
    assert md.versions == ["1"] and md.inputs[0].datatype == "FP32"
    assert list(md.inputs[0].shape) == [-1, 32, 32, 3]


def test_model_config_says_what_http_config_says_in_tritons_form(
    gateway: GrpcServe, client: triton.InferenceServerClient
) -> None:
    config = client.get_model_config(CNN).config
    over_http = triton_http.InferenceServerClient(gateway.http)
    try:
        http = over_http.get_model_config(CNN)
    finally:
        over_http.close()
    assert (config.name, config.max_batch_size) == (CNN, http["max_batch_size"])
    assert (config.platform, config.backend) == ("onnxruntime_onnx", "onnxruntime")
    assert [(t.name, list(t.dims)) for t in config.input] == [("image", [32, 32, 3])]
    assert config.input[0].data_type == model_config_pb2.TYPE_FP32
    batching = config.dynamic_batching
    assert list(batching.preferred_batch_size) == [
        http["dynamic_batching"]["preferred_max_batch_size"]
    ]
    assert (
        batching.max_queue_delay_microseconds
        == (http["dynamic_batching"]["max_queue_delay_microseconds"])
    )
    assert [g.count for g in config.instance_group] == [http["instance_group"][0]["count"]]
    threads = config.parameters["intra_op_threads"].string_value
    assert threads == str(http["parameters"]["intra_op_threads"])
    with pytest.raises(InferenceServerException) as caught:
        client.get_model_config("no_such_model")
    assert caught.value.status() == "StatusCode.NOT_FOUND"


def test_model_statistics_count_what_the_model_served(
    gateway: GrpcServe, client: triton.InferenceServerClient
) -> None:
    def stats() -> Any:
        (entry,) = client.get_inference_statistics(MLP_TF, model_version="1").model_stats
        return entry

    before = stats()
    client.infer(MLP_TF, _inputs(_features(3, seed=5)))
    with pytest.raises(InferenceServerException):  # a wrong shape: a failed request
        client.infer(MLP_TF, _inputs(np.zeros((1, 31), np.float32)))
    after = stats()
    assert (after.name, after.version) == (MLP_TF, "1")
    inference = after.inference_stats
    assert inference.success.count == before.inference_stats.success.count + 1
    assert inference.fail.count == before.inference_stats.fail.count + 1
    assert after.inference_count >= before.inference_count + 3  # rows
    assert after.execution_count >= before.execution_count + 1  # batches
    assert inference.success.ns > before.inference_stats.success.ns
    assert inference.compute_infer.count == inference.queue.count >= 1
    assert after.last_inference > 0
    every = client.get_inference_statistics().model_stats
    assert {(s.name, s.version) for s in every} == {
        (name, "1") for name in (MLP, MLP_TF, CNN, TINY_QUEUE)
    }
    with pytest.raises(InferenceServerException) as caught:
        client.get_inference_statistics("no_such_model")
    assert caught.value.status() == "StatusCode.NOT_FOUND"
    # The same figures over HTTP, as Triton's statistics extension (no request in between).
    over_http = triton_http.InferenceServerClient(gateway.http)
    try:
        (doc,) = over_http.get_inference_statistics(MLP_TF, model_version="1")["model_stats"]
        with pytest.raises(InferenceServerException) as caught:
            over_http.get_inference_statistics("no_such_model")
        assert caught.value.status() == "404"
        everything = over_http.get_inference_statistics()["model_stats"]
    finally:
        over_http.close()
    assert (doc["name"], doc["version"], doc["last_inference"]) == (
        MLP_TF,
        "1",
        after.last_inference,
    )
    assert (doc["inference_count"], doc["execution_count"]) == (
        after.inference_count,
        after.execution_count,
    )
    for field in ("success", "fail", "queue", "compute_infer"):
        ours = getattr(after.inference_stats, field)
        assert doc["inference_stats"][field] == {"count": ours.count, "ns": ours.ns}
    assert {(s["name"], s["version"]) for s in everything} == {(s.name, s.version) for s in every}


def test_repository_index_lists_every_model(client: triton.InferenceServerClient) -> None:
    index = client.get_model_repository_index()
    assert {(m.name, m.version, m.state) for m in index.models} == {
        (name, "1", "READY") for name in (MLP, MLP_TF, CNN, TINY_QUEUE)
    }


@pytest.mark.parametrize("model", [MLP, MLP_TF])
def test_infer_equals_the_same_request_over_http(
    gateway: GrpcServe, client: triton.InferenceServerClient, model: str
) -> None:
    x = _features(3, seed=1)
    result = client.infer(
        model, _inputs(x), request_id="req-1", priority=1, timeout=GENEROUS_TIMEOUT_US
    )
    assert result.get_response().id == "req-1"
    assert result.get_response().model_version == "1"
    expected = _over_http(gateway, model, x).as_numpy("probabilities")
    np.testing.assert_array_equal(result.as_numpy("probabilities"), expected)


def test_typed_contents_in_typed_contents_out(
    gateway: GrpcServe, channel: grpc.Channel, client: triton.InferenceServerClient
) -> None:
    """KServe's typed ``contents`` instead of raw bytes: the reply comes back typed too, with
    the same values as the raw path."""
    x = _features(2, seed=2)
    request = service_pb2.ModelInferRequest(model_name=MLP, id="typed")
    tensor = request.inputs.add(name="features", datatype="FP32", shape=list(x.shape))
    tensor.contents.fp32_contents.extend(x.ravel().tolist())
    reply = _raw_call(channel, request)
    assert reply.id == "typed" and not reply.raw_output_contents
    (out,) = reply.outputs
    typed = np.asarray(out.contents.fp32_contents, dtype=np.float32).reshape(list(out.shape))
    raw = client.infer(MLP, _inputs(x)).as_numpy("probabilities")
    np.testing.assert_array_equal(typed, raw)


def test_asyncio_client_runs_concurrent_requests(gateway: GrpcServe) -> None:
    async def run() -> list[np.ndarray]:
        async with triton_aio.InferenceServerClient(gateway.target) as c:
            replies = await asyncio.gather(
                *(c.infer(MLP, _inputs(_features(1, seed=s))) for s in range(16))
            )
        return [r.as_numpy("probabilities") for r in replies]

    outputs = asyncio.run(run())
    for seed, out in enumerate(outputs):
        expected = _over_http(gateway, MLP, _features(1, seed=seed)).as_numpy("probabilities")
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)  # batched with others


def test_stream_answers_each_request_with_its_id(client: triton.InferenceServerClient) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for i in range(8):
            client.async_stream_infer(MLP, _inputs(_features(1, seed=i)), request_id=f"s{i}")
        client.async_stream_infer("no_such_model", _inputs(_features(1, 0)), request_id="bad")
        client.async_stream_infer(MLP, _inputs(_features(1, 9)), request_id="after-bad")
        got = [answers.get(timeout=60) for _ in range(10)]
    finally:
        client.stop_stream()
    ids = sorted(r.get_response().id for r, e in got if e is None)
    assert ids == sorted([f"s{i}" for i in range(8)] + ["after-bad"])
    errors = [str(e) for r, e in got if e is not None]
    assert len(errors) == 1 and "unknown model 'no_such_model'" in errors[0]


def test_a_refused_stream_request_names_its_id_and_code(channel: grpc.Channel) -> None:
    stream: Any = channel.stream_stream(
        "/inference.GRPCInferenceService/ModelStreamInfer",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=service_pb2.ModelStreamInferResponse.FromString,
    )
    request = service_pb2.ModelInferRequest(model_name=MLP, id="wrong-shape")
    request.inputs.add(name="features", datatype="FP32", shape=[1, 31])
    request.raw_input_contents.append(np.zeros(31, np.float32).tobytes())
    (reply,) = list(stream(iter([request]), timeout=30))
    assert "shape [1, 31]" in reply.error_message
    assert reply.infer_response.id == "wrong-shape"
    assert reply.infer_response.parameters["grpc_status"].string_param == "INVALID_ARGUMENT"


# -- TF Serving's stubs -----------------------------------------------------------------------


def test_tf_serving_predict_equals_http(gateway: GrpcServe, channel: grpc.Channel) -> None:
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    x = _features(4, seed=5)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = MLP_TF
    request.inputs["features"].CopyFrom(tf.make_tensor_proto(x))
    reply = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=30)
    assert reply.model_spec.version.value == 1
    expected = _over_http(gateway, MLP_TF, x).as_numpy("probabilities")
    np.testing.assert_array_equal(tf.make_ndarray(reply.outputs["probabilities"]), expected)


def test_tf_serving_metadata_and_status(channel: grpc.Channel) -> None:
    from tensorflow.core.framework import types_pb2
    from tensorflow_serving.apis import (
        get_model_metadata_pb2,
        get_model_status_pb2,
        model_service_pb2_grpc,
        prediction_service_pb2_grpc,
    )

    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = CNN
    reply = prediction_service_pb2_grpc.PredictionServiceStub(channel).GetModelMetadata(request)
    signatures = get_model_metadata_pb2.SignatureDefMap()
    assert reply.metadata["signature_def"].Unpack(signatures)
    signature = signatures.signature_def["serving_default"]
    assert signature.method_name == "tensorflow/serving/predict"
    (info,) = signature.inputs.values()
    assert info.dtype == types_pb2.DT_FLOAT and info.tensor_shape.dim[0].size == -1

    status_request = get_model_status_pb2.GetModelStatusRequest()
    status_request.model_spec.name = MLP
    status = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(status_request)
    (version,) = status.model_version_status
    assert version.version == 1
    assert version.state == get_model_status_pb2.ModelVersionStatus.AVAILABLE


# -- health and reflection --------------------------------------------------------------------


def test_health_is_serving_for_the_server_and_each_service(channel: grpc.Channel) -> None:
    health: Any = health_pb2_grpc.HealthStub(channel)  # the stubs type no calls
    for service in ("", "inference.GRPCInferenceService", "tensorflow.serving.PredictionService"):
        reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    err = _refusal(lambda: health.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=10))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    watch = health.Watch(health_pb2.HealthCheckRequest(), timeout=10)
    assert next(iter(watch)).status == health_pb2.HealthCheckResponse.SERVING
    watch.cancel()


def test_reflection_lists_and_describes_every_service(channel: grpc.Channel) -> None:
    stub: Any = reflection_pb2_grpc.ServerReflectionStub(channel)
    requests = [reflection_pb2.ServerReflectionRequest(list_services="")] + [
        reflection_pb2.ServerReflectionRequest(file_containing_symbol=name) for name in SERVICES
    ]
    replies = list(stub.ServerReflectionInfo(iter(requests), timeout=10))
    listed = {s.name for s in replies[0].list_services_response.service}
    assert listed == SERVICES
    for reply in replies[1:]:
        assert reply.WhichOneof("message_response") == "file_descriptor_response"
        assert reply.file_descriptor_response.file_descriptor_proto


# -- refusals ---------------------------------------------------------------------------------


def test_unknown_model_or_version_is_not_found(client: triton.InferenceServerClient) -> None:
    for model, version in (("no_such_model", ""), (MLP, "9"), (MLP, "x")):
        with pytest.raises(InferenceServerException) as caught:
            client.infer(model, _inputs(_features(1, 0)), model_version=version)
        assert caught.value.status() == "StatusCode.NOT_FOUND", caught.value


@pytest.mark.parametrize(
    ("tensor", "raw", "message"),
    [
        ({"datatype": "FP32", "shape": [1, 31]}, np.zeros(31, np.float32).tobytes(), "shape"),
        ({"datatype": "FP64", "shape": [1, 32]}, np.zeros(32, np.float64).tobytes(), "datatype"),
        ({"datatype": "FP32", "shape": [1, 32]}, b"\0" * 100, "binary data has 100 bytes"),
        ({"datatype": "NOPE", "shape": [1, 32]}, b"", "unknown datatype"),
        ({"datatype": "FP32", "shape": [1, 1 << 30]}, b"", "over the limit"),
        ({"datatype": "FP32", "shape": [1] * 9 + [32]}, b"", "dimensions exceed"),
    ],
)
def test_a_bad_tensor_is_invalid_argument(
    channel: grpc.Channel, tensor: dict[str, Any], raw: bytes, message: str
) -> None:
    request = service_pb2.ModelInferRequest(model_name=MLP)
    request.inputs.add(name="features", **tensor)
    request.raw_input_contents.append(raw)
    err = _refusal(lambda: _raw_call(channel, request))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
    assert message in err.details(), err
    assert _trailers(err)["iotgw-reason"] == "bad_request"


def test_typed_contents_in_the_wrong_field_are_refused(channel: grpc.Channel) -> None:
    request = service_pb2.ModelInferRequest(model_name=MLP)
    tensor = request.inputs.add(name="features", datatype="FP32", shape=[1, 32])
    tensor.contents.int_contents.extend([1] * 32)
    err = _refusal(lambda: _raw_call(channel, request))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "fp32_contents, not in int_contents" in err.details()


def test_priority_from_tritonclient_is_read_and_checked(
    client: triton.InferenceServerClient,
) -> None:
    """Triton's client sends ``priority`` as uint64_param, a field KServe's InferParameter
    lacks: it is read from the unknown fields, so an out-of-range one is refused."""
    assert client.infer(MLP, _inputs(_features(1, 0)), priority=1).as_numpy("probabilities").size
    with pytest.raises(InferenceServerException) as caught:
        client.infer(MLP, _inputs(_features(1, 0)), priority=10**9)
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "priority" in str(caught.value)


def test_a_request_that_cannot_meet_its_timeout_is_unavailable(channel: grpc.Channel) -> None:
    request = service_pb2.ModelInferRequest(model_name=MLP)
    request.parameters["timeout"].int64_param = 1  # microseconds, as Triton's clients send it
    request.inputs.add(name="features", datatype="FP32", shape=[1, 32])
    request.raw_input_contents.append(_features(1, 0).tobytes())
    err = _refusal(lambda: _raw_call(channel, request))
    assert err.code() == grpc.StatusCode.UNAVAILABLE, err
    assert _trailers(err)["iotgw-reason"] == "deadline"


def test_over_the_byte_budget_is_resource_exhausted(
    client: triton.InferenceServerClient, channel: grpc.Channel
) -> None:
    image_name = client.get_model_metadata(CNN).inputs[0].name
    images = np.zeros((4, 32, 32, 3), np.float32)  # 48 KiB of tensors, over the 32 KiB budget
    request = service_pb2.ModelInferRequest(model_name=CNN)
    request.inputs.add(name=image_name, datatype="FP32", shape=list(images.shape))
    request.raw_input_contents.append(images.tobytes())
    err = _refusal(lambda: _raw_call(channel, request))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
    assert "serving.max_queued_bytes" in err.details()


def test_a_message_over_the_size_limit_is_resource_exhausted(channel: grpc.Channel) -> None:
    request = service_pb2.ModelInferRequest(model_name=MLP)
    request.inputs.add(name="features", datatype="FP32", shape=[1, 32])
    request.raw_input_contents.append(b"\0" * (MAX_MESSAGE + 1))
    err = _refusal(lambda: _raw_call(channel, request))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_a_full_queue_is_unavailable_with_a_retry_delay(gateway: GrpcServe) -> None:
    """A burst at a model that queues one request: the rest are refused at once with when to
    come back; every one accepted is answered correctly."""

    async def burst() -> list[Any]:
        async with grpc.aio.insecure_channel(gateway.target) as ch:
            call: Any = ch.unary_unary(
                _INFER,
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=service_pb2.ModelInferResponse.FromString,
            )
            request = service_pb2.ModelInferRequest(model_name=TINY_QUEUE)
            request.inputs.add(name="features", datatype="FP32", shape=[1, 32])
            request.raw_input_contents.append(_features(1, 0).tobytes())
            return await asyncio.gather(
                *(call(request, timeout=60) for _ in range(64)), return_exceptions=True
            )

    results = asyncio.run(burst())
    refused = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
    answered = [r for r in results if not isinstance(r, BaseException)]
    assert refused and answered, results
    assert len(refused) + len(answered) == len(results), results
    for err in refused:
        assert err.code() == grpc.StatusCode.UNAVAILABLE, err
        trailers = dict(err.trailing_metadata() or ())
        assert trailers["iotgw-reason"] == "queue_full"
        assert int(trailers["retry-after-ms"]) >= 1
    first = answered[0].raw_output_contents[0]
    assert all(r.raw_output_contents[0] == first for r in answered)


def test_bytes_that_are_no_message_are_refused_and_lose_nothing(
    gateway: GrpcServe, channel: grpc.Channel, client: triton.InferenceServerClient
) -> None:
    garbage: Any = channel.unary_unary(_INFER)  # bytes as they are: no serializer
    for payload in (b"\x0a\xff\xff\xff\xff\x0f", b"\x2a\x05\x0a\x03", b"\xff" * 64):
        err = _refusal(lambda payload=payload: garbage(payload, timeout=10))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
    # An unknown field is skipped, as protobuf does: the request is served.
    x = _features(1, 3)
    request = service_pb2.ModelInferRequest(model_name=MLP)
    request.inputs.add(name="features", datatype="FP32", shape=[1, 32])
    request.raw_input_contents.append(x.tobytes())
    reply = garbage(request.SerializeToString() + b"\xf8\x07\x01", timeout=10)
    assert service_pb2.ModelInferResponse.FromString(reply).raw_output_contents
    expected = _over_http(gateway, MLP, x).as_numpy("probabilities")
    np.testing.assert_array_equal(client.infer(MLP, _inputs(x)).as_numpy("probabilities"), expected)


def test_grpc_requests_and_refusals_are_counted_by_transport(gateway: GrpcServe) -> None:
    import urllib.request

    with urllib.request.urlopen(f"http://{gateway.http}/metrics", timeout=10) as r:
        samples = metric_samples(r.read().decode())
    ok = [
        v
        for name, labels, v in samples
        if name == "iotgw_requests_total"
        and labels.get("transport") == "grpc"
        and labels.get("outcome") == "ok"
        and labels.get("model") == MLP
    ]
    assert ok and ok[0] >= 1
    refused = {
        labels["reason"]
        for name, labels, v in samples
        if name == "iotgw_error_replies_total" and labels.get("transport") == "grpc" and v > 0
    }
    assert "not_found" in refused
