"""The failures a model can cause, end to end over gRPC (a real grpc.aio server on 127.0.0.1
around a real ONNX Runtime backend behind a gate): a backend that raises is INTERNAL, as it is a
500 over HTTP; a call whose deadline passes while its batch is still running is
DEADLINE_EXCEEDED, and so is a batch the watchdog gives up on. Nothing is left held: the model
answers the next request and the byte budget is back to zero."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc.aio as triton_aio
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from gateway.edge import Edge
from gateway.grpc.server import GrpcServer
from gateway.lifecycle import Readiness
from gateway.service import InferenceService
from gateway.settings.schema import GrpcSettings, HttpSettings, ServingSettings
from models.repository import ModelVersion
from models.runtime import Runtime, Threads
from tests.gateway.gated_runtime import (  # noqa: F401 (*_fixture: pytest fixtures)
    EVENT_DEADLINE_S,
    MODEL,
    Gate,
    GatedRuntime,
    features,
    gated_service,
    mlp_repo,
    reference_fixture,
    source_fixture,
)
from tests.gateway.helpers import metric_samples

pytestmark = pytest.mark.asyncio(loop_scope="function")

# One instance, one request per batch: a request never shares its batch with another.
BATCHING = {"concurrency": 1, "max_batch_size": 1, "batch_timeout_ms": 0.0}
_INFER = "/inference.GRPCInferenceService/ModelInfer"
# Shorter than a blocked backend call (it returns only when the test opens the gate), far
# longer than the way from the client to the backend.
CLIENT_DEADLINE_S = 2.0
WATCHDOG_S = 0.5


class FaultyGate(Gate):
    """A ``Gate`` whose runtimes can also be told to raise on their next call."""

    def __init__(self) -> None:
        super().__init__()
        self._fail = False

    def fail_next(self) -> None:
        self._fail = True

    def take_failure(self) -> bool:
        failing, self._fail = self._fail, False
        return failing

    def loader(self, version: ModelVersion, threads: Threads) -> Runtime:
        return _Faulty(super().loader(version, threads), self)


class _Faulty:
    def __init__(self, inner: Runtime, gate: FaultyGate) -> None:
        self._inner = inner
        self._gate = gate
        self.metadata = inner.metadata
        self.threads = inner.threads
        self.device = inner.device

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._gate.take_failure():
            raise RuntimeError("the backend failed on this batch")
        return self._inner.infer(inputs)

    def close(self) -> None:
        self._inner.close()


@contextlib.asynccontextmanager
async def grpc_front(service: InferenceService) -> AsyncIterator[GrpcServer]:
    """The gateway's gRPC server on a free port of 127.0.0.1, around ``service``."""
    serving = ServingSettings()
    with ThreadPoolExecutor(1, thread_name_prefix="test-grpc") as executor:
        edge = Edge(
            service=service,
            executor=executor,
            limits=serving.decode_limits(),
            transport="grpc",
        )
        server = GrpcServer(
            settings=GrpcSettings(port=0),
            http=HttpSettings(host="127.0.0.1"),
            service=service,
            edge=edge,
            readiness=Readiness(),
            executor=executor,
        )
        await server.start()
        try:
            yield server
        finally:
            await server.stop(1.0)


def _request(seed: int) -> Any:
    request = service_pb2.ModelInferRequest(model_name=MODEL, id=f"r{seed}")
    x = features(1, seed)["features"]
    request.inputs.add(name="features", datatype="FP32", shape=list(x.shape))
    request.raw_input_contents.append(x.tobytes())
    return request


def _infer(channel: grpc.aio.Channel) -> Any:
    return channel.unary_unary(
        _INFER,
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=service_pb2.ModelInferResponse.FromString,
    )


async def _refused(call: Any, request: Any, deadline_s: float) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call(request, timeout=deadline_s)
    return caught.value


async def _served_equal(call: Any, reference: Runtime, seed: int) -> None:
    reply = await call(_request(seed), timeout=EVENT_DEADLINE_S)
    got = np.frombuffer(reply.raw_output_contents[0], np.float32)
    want = reference.infer(features(1, seed))["probabilities"].ravel()
    np.testing.assert_array_equal(got, want)


def _error_replies(service: InferenceService, reason: str) -> float:
    return sum(
        v
        for name, labels, v in metric_samples(service.metrics.render().decode())
        if name == "iotgw_error_replies_total" and labels == {"transport": "grpc", "reason": reason}
    )


async def test_a_backend_that_raises_is_internal_and_the_model_serves_on(
    source: Path, tmp_path: Path, reference: Runtime
) -> None:
    gate = FaultyGate()
    repo = mlp_repo(tmp_path / "repo", source, **BATCHING)
    async with gated_service(repo, gate) as service, grpc_front(service) as server:
        target = f"127.0.0.1:{server.port}"
        async with grpc.aio.insecure_channel(target) as channel:
            call = _infer(channel)
            gate.fail_next()
            err = await _refused(call, _request(1), EVENT_DEADLINE_S)
            assert err.code() == grpc.StatusCode.INTERNAL, err
            assert f"model {MODEL}/1: inference failed" in (err.details() or ""), err
            assert "the backend failed on this batch" in (err.details() or ""), err
            assert dict(err.trailing_metadata() or ())["iotgw-reason"] == "internal"
            await _served_equal(call, reference, 2)
        # As Triton's asyncio client sees it.
        async with triton_aio.InferenceServerClient(target) as client:
            tensor = triton_aio.InferInput("features", [1, 32], "FP32")
            tensor.set_data_from_numpy(features(1, 3)["features"])
            gate.fail_next()
            with pytest.raises(InferenceServerException) as caught:
                await client.infer(MODEL, [tensor])
            assert caught.value.status() == "StatusCode.INTERNAL"
            assert (await client.infer(MODEL, [tensor])).as_numpy("probabilities") is not None
        assert _error_replies(service, "internal") == 2
        assert service.byte_budget.charged == 0


async def test_a_bug_in_the_service_is_internal_as_it_is_a_500_over_http(
    source: Path, tmp_path: Path, reference: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The HTTP test's fault injection (``test_poison``): the service raises a non-gateway
    exception; gRPC answers INTERNAL without the exception's words, and serves on after it."""

    async def broken(*args: object, **kwargs: object) -> object:
        raise KeyError("a bug")

    repo = mlp_repo(tmp_path / "repo", source, **BATCHING)
    async with (
        gated_service(repo, Gate()) as service,
        grpc_front(service) as server,
        grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel,
    ):
        call = _infer(channel)
        monkeypatch.setattr(service, "infer", broken)
        err = await _refused(call, _request(1), EVENT_DEADLINE_S)
        assert err.code() == grpc.StatusCode.INTERNAL, err
        assert "internal error" in (err.details() or "")
        assert "a bug" not in (err.details() or "")
        assert dict(err.trailing_metadata() or ())["iotgw-reason"] == "internal"
        monkeypatch.undo()
        await _served_equal(call, reference, 2)


async def test_a_deadline_shorter_than_the_batch_is_deadline_exceeded_and_frees_the_request(
    source: Path, tmp_path: Path, reference: Runtime
) -> None:
    """The backend call blocks until the test opens the gate, so the client's deadline passes
    while the batch runs, whatever the machine's pace: DEADLINE_EXCEEDED. Once the call
    returns, the gateway holds nothing of the request and the model answers the next one."""
    gate = Gate()
    repo = mlp_repo(tmp_path / "repo", source, **BATCHING)
    async with gated_service(repo, gate) as service, grpc_front(service) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            call = _infer(channel)
            gate.arm()
            err = await _refused(call, _request(1), CLIENT_DEADLINE_S)
            assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED, err
            # The request did reach the backend: the deadline passed during its batch.
            assert await asyncio.to_thread(gate.entered.wait, EVENT_DEADLINE_S)
            gate.open()
            await _served_equal(call, reference, 2)
        assert await server.in_flight.wait_idle(EVENT_DEADLINE_S)
        assert service.byte_budget.charged == 0
        stuck = gate.stuck
        assert isinstance(stuck, GatedRuntime) and stuck.calls >= 1  # it finished its call


async def test_a_batch_past_the_watchdog_is_deadline_exceeded_with_its_reason(
    source: Path, tmp_path: Path, reference: Runtime
) -> None:
    """The client's deadline is generous; the gateway's watchdog gives up on the blocked batch
    first (the gate stays shut): the gateway's own DEADLINE_EXCEEDED, saying why."""
    gate = Gate()
    repo = mlp_repo(tmp_path / "repo", source, **BATCHING)
    async with (
        gated_service(repo, gate, batch_watchdog_s=WATCHDOG_S) as service,
        grpc_front(service) as server,
    ):
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            call = _infer(channel)
            gate.arm()
            err = await _refused(call, _request(1), EVENT_DEADLINE_S)
            assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED, err
            assert "serving.batch_watchdog_s" in (err.details() or ""), err
            assert dict(err.trailing_metadata() or ())["iotgw-reason"] == "batch_timeout"
            await _served_equal(call, reference, 2)  # by a fresh instance
        assert _error_replies(service, "batch_timeout") == 1
