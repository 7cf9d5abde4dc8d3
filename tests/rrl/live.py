"""A live gateway for the online agent's tests: the gateway itself, open-loop Poisson load with a
generous explicit deadline, decision logs, and an agent built by hand on a running service."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from gateway.main import Gateway
from gateway.settings.schema import GatewaySettings
from gateway.tuning import AgentControl
from rrl.agent.decisions import log_line
from rrl.agent.model_agent import AgentSettings, ModelAgent
from rrl.tuners.measurement import Measurement
from rrl.tuners.space import ConfigSpace
from rrl.tuners.workload import WorkloadState

# Every request carries a 30 s deadline: these tests check what the agent does and that no
# request fails because of a knob change, not the SLO (the load is generated on the gateway's
# own event loop, so on a busy machine the model's 100 ms would refuse requests for nothing).
DEADLINE_US = 30_000_000
BODY = {
    "inputs": [{"name": "features", "shape": [1, 32], "datatype": "FP32", "data": [0.25] * 32}],
    "parameters": {"timeout": DEADLINE_US},
}
# Two configurations that differ in the batch size only: no rebuild between them.
TINY = ConfigSpace(
    batch_sizes=(1, 2),
    timeouts_ms=(0.0,),
    concurrency=(1,),
    intra_op_threads=(1,),
    inter_op_threads=(1,),
)
# The batch size axis alone, 1..128.
BATCHES = ConfigSpace(
    batch_sizes=tuple(2**i for i in range(8)),
    timeouts_ms=(0.0,),
    concurrency=(1,),
    intra_op_threads=(1,),
    inter_op_threads=(1,),
)


@contextlib.asynccontextmanager
async def gateway(repo: Path, tmp: Path, **tuner: Any) -> AsyncIterator[Gateway]:
    settings = GatewaySettings.load(
        http={"port": 0, "host": "127.0.0.1"},
        serving={"model_repo": repo, "cache_dir": tmp / "cache"},
        mqtt={"enabled": False},
        tuner={"enabled": True, "models": ["sensor_mlp"], **tuner},
    )
    gw = Gateway(settings)
    await gw.start(wait_ready=True)
    try:
        yield gw
    finally:
        await gw.stop()


async def until(
    condition: Callable[[], bool],
    what: str,
    timeout_s: float = 60.0,
    explain: ModelAgent | None = None,
) -> None:
    """Wait for a condition of the agent's state (checked as the agent's loop moves on); on a
    timeout, ``explain``'s decisions say what it did instead."""
    end = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= end:
            log = [] if explain is None else [log_line(d) for d in explain.policy.history]
            raise AssertionError(f"{what}: not within {timeout_s:g}s\n" + "\n".join(log))
        await asyncio.sleep(0.05)


async def load_until(
    loads: Sequence[Coroutine[Any, Any, object]],
    condition: Callable[[], bool],
    what: str,
    explain: ModelAgent | None = None,
) -> None:
    """Run ``loads`` (``poisson_load`` calls counting into their ``statuses``) until
    ``condition`` holds or every load has ended, then cancel what is still running. A load that
    failed before that fails the caller; the condition itself is the caller's to assert."""
    tasks = [asyncio.create_task(load) for load in loads]
    try:
        await until(lambda: condition() or all(t.done() for t in tasks), what, explain=explain)
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t


async def poisson_load(
    url: str,
    rate_per_s: float,
    seconds: float,
    seed: int = 0,
    statuses: dict[int, int] | None = None,
    model: str = "sensor_mlp",
    body: dict[str, Any] | None = None,
) -> dict[int, int]:
    """Open-loop Poisson arrivals of single-row requests (``body``, by default sensor_mlp's
    ``BODY``); returns the count per HTTP status (and fails with the bodies of the first
    refusals, if any). ``statuses``, when given, is counted into as replies come, so a load
    cancelled once the test has seen what it waited for still tells how every request answered
    so far was answered."""
    request = BODY if body is None else body
    statuses = {} if statuses is None else statuses
    reasons: list[str] = []
    rng = np.random.default_rng(seed)
    pending: set[asyncio.Task[None]] = set()
    async with aiohttp.ClientSession() as http:

        async def one() -> None:
            async with http.post(f"{url}/v2/models/{model}/infer", json=request) as r:
                body = await r.read()
                statuses[r.status] = statuses.get(r.status, 0) + 1
                if r.status != 200:
                    reasons.append(body.decode(errors="replace"))

        # Each arrival at its own time on the trace, not a gap after the previous one: a busy
        # loop wakes a sleep late, and gaps measured from those wake-ups would fall behind the
        # rate asked for (a third of it, under heavy steal). A late arrival is sent at once.
        at = time.monotonic()
        end = at + seconds
        while at < end:
            await asyncio.sleep(max(at - time.monotonic(), 0.0))
            task = asyncio.create_task(one())
            pending.add(task)
            task.add_done_callback(pending.discard)
            at += float(rng.exponential(1.0 / rate_per_s))
        await asyncio.gather(*pending)
    assert not reasons, reasons[:5]
    return statuses


# The live tests each isolate one rule (the gate's, the rest's, the budget's): the measured
# search, which tries neighbours the gate would not, is decided in tests/rrl/test_evidence.py.
ISOLATED: dict[str, Any] = {"interval_s": 0.4, "min_requests": 30, "measured_search": False}


@contextlib.asynccontextmanager
async def running_agent(
    gw: Gateway, space: ConfigSpace, start: Any, **settings: Any
) -> AsyncIterator[ModelAgent]:
    """An agent of the test's own on sensor_mlp (SLO 100 ms, 2 cores, 0.4 s windows), on a
    gateway whose tuner is off, running until the block ends."""
    agent = ModelAgent(
        AgentControl(gw.service),
        "sensor_mlp",
        space=space,
        slo_ms=100.0,
        cores=2,
        settings=AgentSettings(**{**ISOLATED, "start": start, **settings}),
    )
    task = asyncio.create_task(agent.run())
    await asyncio.wait_for(agent.started.wait(), timeout=60.0)
    try:
        yield agent
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def tuner_state(url: str, model: str = "sensor_mlp") -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{url}/admin/tuner/{model}?decisions=1000") as r,
    ):
        assert r.status == 200
        return dict(await r.json())


async def started(gw: Gateway, model: str = "sensor_mlp") -> ModelAgent:
    """The gateway's agent once it has loaded its priors and applied its start."""
    assert gw.tuning is not None
    agent = gw.tuning.agent(model)
    await asyncio.wait_for(agent.started.wait(), timeout=120.0)
    return agent


def measurement(p95_ms: float, violations: int = 0, n: int = 100) -> Measurement:
    return Measurement(
        duration_s=2.0,
        offered=n,
        completed=n,
        p50_ms=p95_ms / 2,
        p95_ms=p95_ms,
        p99_ms=p95_ms,
        slo_violations=violations,
        rejected=0,
    )


def hand_built_agent(
    gw: Gateway, space: ConfigSpace, model: str = "sensor_mlp", **settings: Any
) -> ModelAgent:
    """An agent on the gateway's service, not started: its rules driven step by step."""
    agent = ModelAgent(
        AgentControl(gw.service),
        model,
        space=space,
        slo_ms=100.0,
        cores=2,
        settings=AgentSettings(**{"algorithm": "rrl", "measured_search": False, **settings}),
    )
    agent.policy.current = agent.policy.incumbent = space.at(0)
    agent.policy.workload = WorkloadState(5)
    agent.policy.tuner.set_workload(agent.policy.workload)
    return agent
