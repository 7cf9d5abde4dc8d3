"""gRPC with the gateway's security, bounds and lifecycle: TLS from HTTP's certificate files,
bearer tokens in the ``authorization`` metadata (inference and admin), a stream's bound on the
requests it answers at once, health turning NOT_SERVING while the gateway drains, a port in use
refused at start, and no port at all with gRPC off. In-process gateways, asyncio clients on the
same loop."""

from __future__ import annotations

import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import trustme
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2

from gateway.lifecycle import StartupError
from gateway.main import Gateway
from gateway.settings.schema import GatewaySettings
from tests.gateway.certificates import server_certificate
from tests.gateway.helpers import make_repo, running_gateway

pytestmark = pytest.mark.asyncio(loop_scope="session")

MODEL = "sensor_mlp"
INFERENCE, ADMIN = "inference-secret", "admin-secret"
_OIP = "/inference.GRPCInferenceService"


@pytest.fixture(scope="module")
def repo(demo_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repo(tmp_path_factory.mktemp("grpc-sec") / "repo", demo_repo, {MODEL: None})


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[trustme.CA, Path, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1, as PEM files."""
    return server_certificate(tmp_path_factory.mktemp("grpc-tls"))


def _call(
    channel: grpc.aio.Channel, method: str, reply: Any
) -> grpc.aio.UnaryUnaryMultiCallable[Any, Any]:
    return channel.unary_unary(
        f"{_OIP}/{method}",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=reply.FromString,
    )


def _infer_request() -> Any:
    request = service_pb2.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name="features", datatype="FP32", shape=[1, 32])
    request.raw_input_contents.append(np.zeros(32, np.float32).tobytes())
    return request


async def _code(call: Any, request: Any, metadata: Sequence[tuple[str, str]] = ()) -> Any:
    try:
        await call(request, metadata=metadata, timeout=30)
    except grpc.aio.AioRpcError as err:
        return err.code()
    return grpc.StatusCode.OK


def _bearer(token: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {token}"),)


async def test_tls_and_tokens_guard_the_calls(
    repo: Path, tmp_path: Path, tls: tuple[trustme.CA, Path, Path]
) -> None:
    ca, cert_file, key_file = tls
    async with running_gateway(
        repo,
        tmp_path,
        tls_cert_file=cert_file,
        tls_key_file=key_file,
        inference_token=INFERENCE,
        admin_token=ADMIN,
    ) as gw:
        assert gw.grpc is not None
        target = f"127.0.0.1:{gw.grpc.port}"
        credentials = grpc.ssl_channel_credentials(root_certificates=ca.cert_pem.bytes())
        async with grpc.aio.secure_channel(target, credentials) as channel:
            health: Any = health_pb2_grpc.HealthStub(channel)  # the stubs type no calls
            reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=30)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING  # open for probes
            live = _call(channel, "ServerLive", service_pb2.ServerLiveResponse)
            assert await _code(live, service_pb2.ServerLiveRequest()) == grpc.StatusCode.OK

            infer = _call(channel, "ModelInfer", service_pb2.ModelInferResponse)
            assert await _code(infer, _infer_request()) == grpc.StatusCode.UNAUTHENTICATED
            wrong = _bearer("guess")
            assert await _code(infer, _infer_request(), wrong) == grpc.StatusCode.UNAUTHENTICATED
            assert await _code(infer, _infer_request(), _bearer(INFERENCE)) == grpc.StatusCode.OK

            unload = _call(
                channel, "RepositoryModelUnload", service_pb2.RepositoryModelUnloadResponse
            )
            load = _call(channel, "RepositoryModelLoad", service_pb2.RepositoryModelLoadResponse)
            ready = _call(channel, "ModelReady", service_pb2.ModelReadyResponse)
            by_name = service_pb2.RepositoryModelUnloadRequest(model_name=MODEL)
            assert await _code(unload, by_name, _bearer(INFERENCE)) == (
                grpc.StatusCode.UNAUTHENTICATED  # loading and unloading are the admin's
            )
            assert await _code(unload, by_name, _bearer(ADMIN)) == grpc.StatusCode.OK
            probe = service_pb2.ModelReadyRequest(name=MODEL)
            assert not (await ready(probe, metadata=_bearer(INFERENCE), timeout=30)).ready
            again = service_pb2.RepositoryModelLoadRequest(model_name=MODEL)
            assert await _code(load, again, _bearer(ADMIN)) == grpc.StatusCode.OK
            assert (await ready(probe, metadata=_bearer(INFERENCE), timeout=30)).ready

        async with grpc.aio.insecure_channel(target) as plain:
            live = _call(plain, "ServerLive", service_pb2.ServerLiveResponse)
            assert await _code(live, service_pb2.ServerLiveRequest()) == (
                grpc.StatusCode.UNAVAILABLE  # no plaintext beside TLS
            )


async def test_health_is_not_serving_while_the_gateway_drains(repo: Path, tmp_path: Path) -> None:
    async with running_gateway(repo, tmp_path) as gw:
        assert gw.grpc is not None
        async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.grpc.port}") as channel:
            health: Any = health_pb2_grpc.HealthStub(channel)  # the stubs type no calls
            watch = health.Watch(health_pb2.HealthCheckRequest(), timeout=60)
            first = await watch.read()
            assert first.status == health_pb2.HealthCheckResponse.SERVING
            assert await gw.drain(5.0)
            reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=30)
            assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
            assert (await watch.read()).status == health_pb2.HealthCheckResponse.NOT_SERVING
            watch.cancel()
            ready = _call(channel, "ServerReady", service_pb2.ServerReadyResponse)
            assert not (await ready(service_pb2.ServerReadyRequest(), timeout=30)).ready
            # Requests still taken while draining, as over HTTP: the balancer reads NOT_SERVING.
            infer = _call(channel, "ModelInfer", service_pb2.ModelInferResponse)
            assert await _code(infer, _infer_request()) == grpc.StatusCode.OK


async def test_a_grpc_port_in_use_fails_the_start_naming_the_option(
    repo: Path, tmp_path: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        settings = GatewaySettings.load(
            http={"port": 0, "host": "127.0.0.1"},
            grpc={"port": taken.getsockname()[1]},
            serving={"model_repo": repo, "cache_dir": tmp_path},
            mqtt={"enabled": False},
        )
        with pytest.raises(StartupError, match="--grpc-port"):
            await Gateway(settings).start()


async def test_no_grpc_leaves_the_port_alone(repo: Path, tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = GatewaySettings.load(
        http={"port": 0, "host": "127.0.0.1"},
        grpc={"enabled": False, "port": port},
        serving={"model_repo": repo, "cache_dir": tmp_path},
        mqtt={"enabled": False},
    )
    gw = Gateway(settings)
    await gw.start()
    try:
        assert gw.grpc is None
        with socket.socket() as again:
            again.bind(("127.0.0.1", port))  # nothing listens there
    finally:
        await gw.stop()


async def test_a_stream_answers_at_most_its_bound_at_once(repo: Path, tmp_path: Path) -> None:
    """With one request in flight per stream, the next is read only once the previous one is
    answered: the replies come back in the order sent, whatever each one's size."""
    settings = GatewaySettings.load(
        http={"port": 0, "host": "127.0.0.1"},
        grpc={"port": 0, "stream_max_in_flight": 1},
        serving={"model_repo": repo, "cache_dir": tmp_path},
        mqtt={"enabled": False},
    )
    gw = Gateway(settings)
    await gw.start(wait_ready=True)
    try:
        assert gw.grpc is not None
        async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.grpc.port}") as channel:
            stream: Any = channel.stream_stream(
                f"{_OIP}/ModelStreamInfer",
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=service_pb2.ModelStreamInferResponse.FromString,
            )
            requests = []
            for i in range(24):
                rows = 64 if i % 3 == 0 else 1  # big ones first in every three
                request = service_pb2.ModelInferRequest(model_name=MODEL, id=f"r{i}")
                request.inputs.add(name="features", datatype="FP32", shape=[rows, 32])
                request.raw_input_contents.append(np.zeros((rows, 32), np.float32).tobytes())
                requests.append(request)
            call = stream(iter(requests), timeout=60)
            ids = [reply.infer_response.id async for reply in call]
        assert ids == [f"r{i}" for i in range(24)]
    finally:
        await gw.stop()
