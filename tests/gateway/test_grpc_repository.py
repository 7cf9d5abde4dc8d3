"""Triton's model repository extension over gRPC as Triton's users call it: ``tritonclient.grpc``'s
``get_model_repository_index``, ``unload_model`` and ``load_model``, sync and asyncio, against a
real ``iotgw serve``. An unloaded model is refused as unloaded while the others serve on; loaded
again, it answers as before; a name the repository lacks is NOT_FOUND."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton
import tritonclient.grpc.aio as triton_aio
from tritonclient.utils import InferenceServerException

from tests.gateway.gated_runtime import write_sensor_mlp
from tests.gateway.grpc_serve import GrpcServe, add_variant, grpc_serve
from tests.gateway.helpers import make_repo

# One `iotgw serve` (ONNX Runtime only) for the module: seconds to start.
pytestmark = pytest.mark.slow

MLP, SYNC_COPY, ASYNC_COPY = "sensor_mlp", "sensor_mlp_sync", "sensor_mlp_async"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcServe]:
    folder = tmp_path_factory.mktemp("grpc-repo")
    source = write_sensor_mlp(folder / "source")
    repo = make_repo(folder / "repo", source, {MLP: None})
    # A copy per client kind, so that each test unloads a model of its own.
    for name in (SYNC_COPY, ASYNC_COPY):
        add_variant(repo, MLP, name, {})
    with grpc_serve(repo, folder) as gw:
        yield gw


def _inputs(seed: int) -> list[triton.InferInput]:
    x = np.random.default_rng(seed).standard_normal((2, 32)).astype(np.float32)
    tensor = triton.InferInput("features", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return [tensor]


def _states(index: Any) -> dict[str, tuple[str, str]]:  # a RepositoryIndexResponse
    return {m.name: (m.state, m.reason) for m in index.models}


def test_sync_client_unloads_and_loads_a_model(gateway: GrpcServe) -> None:
    client = triton.InferenceServerClient(gateway.target)
    try:
        before = client.infer(SYNC_COPY, _inputs(1)).as_numpy("probabilities")
        assert _states(client.get_model_repository_index())[SYNC_COPY] == ("READY", "")

        client.unload_model(SYNC_COPY)
        assert not client.is_model_ready(SYNC_COPY)
        assert _states(client.get_model_repository_index())[SYNC_COPY] == (
            "UNAVAILABLE",
            "unloaded",
        )
        with pytest.raises(InferenceServerException) as caught:
            client.infer(SYNC_COPY, _inputs(1))
        assert caught.value.status() == "StatusCode.UNAVAILABLE"
        assert "is unloaded" in str(caught.value)
        assert client.is_model_ready(MLP)  # the others serve on
        np.testing.assert_array_equal(
            client.infer(MLP, _inputs(1)).as_numpy("probabilities"), before
        )
        client.unload_model(SYNC_COPY)  # twice is no error

        client.load_model(SYNC_COPY)
        assert client.is_model_ready(SYNC_COPY)
        assert _states(client.get_model_repository_index())[SYNC_COPY] == ("READY", "")
        after = client.infer(SYNC_COPY, _inputs(1)).as_numpy("probabilities")
        np.testing.assert_array_equal(after, before)

        for call in (client.load_model, client.unload_model):
            with pytest.raises(InferenceServerException) as caught:
                call("no_such_model")
            assert caught.value.status() == "StatusCode.NOT_FOUND", call
    finally:
        client.close()


def test_asyncio_client_unloads_and_loads_a_model(gateway: GrpcServe) -> None:
    async def run() -> None:
        async with triton_aio.InferenceServerClient(gateway.target) as client:
            before = (await client.infer(ASYNC_COPY, _inputs(2))).as_numpy("probabilities")
            index = await client.get_model_repository_index(as_json=True)
            listed = {m["name"]: m["state"] for m in index["models"]}
            assert listed == {MLP: "READY", SYNC_COPY: "READY", ASYNC_COPY: "READY"}

            await client.unload_model(ASYNC_COPY)
            assert not await client.is_model_ready(ASYNC_COPY)
            states = _states(await client.get_model_repository_index())
            assert states[ASYNC_COPY] == ("UNAVAILABLE", "unloaded")
            with pytest.raises(InferenceServerException) as caught:
                await client.infer(ASYNC_COPY, _inputs(2))
            assert caught.value.status() == "StatusCode.UNAVAILABLE"

            await client.load_model(ASYNC_COPY)
            assert await client.is_model_ready(ASYNC_COPY)
            after = (await client.infer(ASYNC_COPY, _inputs(2))).as_numpy("probabilities")
            np.testing.assert_array_equal(after, before)
            with pytest.raises(InferenceServerException) as caught:
                await client.load_model("no_such_model")
            assert caught.value.status() == "StatusCode.NOT_FOUND"

    asyncio.run(run())
