"""A dispatch loop killed by a bug is logged once and restarted: the requests queued before the
fault and those sent after it are all answered; stopping the batcher still ends it for good."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gateway.types import InferenceRequest
from models.runtime import Runtime
from tests.gateway.gated_runtime import (  # noqa: F401 (*_fixture: pytest fixtures)
    MODEL,
    Gate,
    features,
    gated_service,
    mlp_repo,
    reference_fixture,
    source_fixture,
)

BATCHING = {"concurrency": 1, "max_batch_size": 4, "batch_timeout_ms": 0.0}


def _fail_once(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` with a bug that fires on its first call only."""
    calls = 0

    def faulty(*args: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("injected dispatch fault")
        return method(*args)

    return faulty


def _fail_once_async(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    calls = 0

    async def faulty(*args: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("injected dispatch fault")
        return await method(*args)

    return faulty


# The fault hits before a batch is taken (while collecting) or after (launching it, when the
# requests are already out of the queue and must be put back).
@pytest.mark.parametrize("step", ["_collect", "_launch"])
async def test_the_dispatch_loop_is_restarted_and_loses_no_request(
    source: Path,
    tmp_path: Path,
    step: str,
    reference: Runtime,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    repo = mlp_repo(tmp_path / "repo", source, **BATCHING)
    async with gated_service(repo, Gate()) as service:
        batcher = service.registry.host(MODEL)._batcher
        original = getattr(batcher, step)
        wrap = _fail_once_async if step == "_collect" else _fail_once
        monkeypatch.setattr(batcher, step, wrap(original))

        async def one(seed: int) -> np.ndarray:
            request = InferenceRequest(MODEL, features(2, seed), timeout_s=60.0)
            response = await service.infer(request, transport="test")
            return response.outputs["probabilities"]

        with caplog.at_level(logging.ERROR, logger="gateway.batcher"):
            before = await asyncio.gather(*(one(seed) for seed in range(8)))
            after = await asyncio.gather(*(one(seed) for seed in range(8, 16)))

        for seed, got in enumerate(before + after):
            want = reference.infer(features(2, seed))["probabilities"]
            np.testing.assert_array_equal(got, want)
        failures = [r for r in caplog.records if "dispatch loop failed" in r.getMessage()]
        assert len(failures) == 1
        assert failures[0].exc_info is not None  # with its traceback
        assert service.byte_budget.charged == 0
        supervisor = batcher._loop_task
        assert supervisor is not None and not supervisor.done()

    # ``stop`` (through ``close``) ends the supervised loop for good.
    assert supervisor.done() and batcher._loop_task is None
