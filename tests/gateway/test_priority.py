"""Priority scheduling: requests waiting for a busy model are served most urgent first
(``priority`` 1 is the most urgent, 0 means the default level 5), and in order of arrival
within one level. A real ONNX Runtime session behind a gate holds the model busy while the
queue fills, so the order is the batcher's alone."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np

from gateway.codecs import oip
from gateway.types import InferenceRequest
from models.runtime import Runtime
from tests.gateway.gated_runtime import (  # noqa: F401 (*_fixture: pytest fixtures)
    EVENT_DEADLINE_S,
    MODEL,
    Gate,
    features,
    gated_service,
    mlp_repo,
    reference_fixture,
    source_fixture,
)

# One request per batch, one batch at a time: the order of completion is the order served.
BATCHING = {"concurrency": 1, "max_batch_size": 1, "batch_timeout_ms": 0.0}
# (name, priority) in order of arrival, queued behind a request that holds the model.
QUEUED = [
    ("low-1", 9),
    ("default-1", 0),
    ("urgent-1", 1),
    ("low-2", 9),
    ("level-5", 5),
    ("urgent-2", 1),
    ("level-3", 3),
]
SERVED = ["urgent-1", "urgent-2", "level-3", "default-1", "level-5", "low-1", "low-2"]


def test_the_wire_parameter_sets_the_priority() -> None:
    body = {
        "inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}],
        "parameters": {"priority": 2},
    }
    request, _ = oip.decode_request(json.dumps(body).encode(), model=MODEL, version=None)
    assert request.priority == 2
    del body["parameters"]
    request, _ = oip.decode_request(json.dumps(body).encode(), model=MODEL, version=None)
    assert request.priority == 0


async def test_queued_requests_are_served_most_urgent_first(
    source: Path, tmp_path: Path, reference: Runtime
) -> None:
    gate = Gate()
    served: list[str] = []
    async with gated_service(mlp_repo(tmp_path / "repo", source, **BATCHING), gate) as service:

        async def infer(name: str, priority: int, seed: int) -> np.ndarray:
            request = InferenceRequest(MODEL, features(1, seed), timeout_s=60.0, priority=priority)
            response = await service.infer(request, transport="test")
            served.append(name)
            return response.outputs["probabilities"]

        gate.arm()
        holder = asyncio.create_task(infer("holder", 0, 100))
        assert await asyncio.to_thread(gate.entered.wait, EVENT_DEADLINE_S)
        queued = []
        for seed, (name, priority) in enumerate(QUEUED):
            queued.append(asyncio.create_task(infer(name, priority, seed)))
        await asyncio.sleep(0)  # each task runs up to its first wait: its request is queued
        assert service.stats(MODEL).queue_depth == len(QUEUED)
        gate.open()
        outputs = await asyncio.gather(holder, *queued)

    assert served == ["holder", *SERVED]
    for seed, got in enumerate(outputs[1:]):  # each answer is its own request's
        want = reference.infer(features(1, seed))["probabilities"]
        np.testing.assert_array_equal(got, want)
