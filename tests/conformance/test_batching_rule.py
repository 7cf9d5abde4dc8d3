"""One owner for the batching rule: every simulation of the gateway's batcher is held to the
batcher itself, run in virtual time on the same arrivals and batch times
(``tests.conformance.virtual_batcher``):

- the agent's open-loop prediction (``rrl.offline.replay.simulate`` over
  ``rrl.offline.batcher_sim``) forms the batches, refuses the requests and gives the latencies
  of the gateway's own ``Batcher``;
- the agent's closed-loop prediction (``rrl.offline.replay.closed_loop_throughput``) serves
  what it serves, within 1%;
- the profiling harness (``rrl.offline.harness``) runs ``BatcherSim``'s decisions on its clock
  (the wall clock when it profiles), so what holds the simulation holds it
  (``tests/rrl/test_harness.py`` checks on virtual time that it forms the simulation's batches,
  refusals and latencies);
- ``iotgw bench tuner``'s whole-gateway replay (``benchmarks.tuner.serial_loop``), with no loop
  costs and cores to spare, refuses and answers as it does.

Tolerance: batch starts and latencies within 2 ns (the virtual loop's clock counts whole
nanoseconds); batch sizes and the set of refused requests exactly. Batch times are chosen off
round numbers, so that no decision sits within a nanosecond of its threshold (a tie there may
go either way, on the loop as in the simulation).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest

from benchmarks.tuner import serial_loop
from models.knobs import Knobs
from rrl.offline.batcher_sim import BatcherSim, BatchTimes
from rrl.offline.replay import ServiceTimes, closed_loop_throughput, simulate
from tests.conformance.virtual_batcher import (
    CLOCK_RESOLUTION_S,
    BatcherRun,
    run_batcher,
    run_closed_loop,
)

CLOCK_S = 2 * CLOCK_RESOLUTION_S
DEADLINE_S = 0.0503


def two_cores(rows: int) -> float:
    """A batch's runtime call: a fixed cost per call and a cost per row."""
    return 0.00213 + 0.000487 * rows


def poisson(rate_per_s: float, n: int, seed: int) -> list[float]:
    rng = np.random.default_rng(seed)
    return np.cumsum(rng.exponential(1.0 / rate_per_s, n)).tolist()


def bursts(n: int, seed: int) -> list[float]:
    """Bursts of 10-40 requests within a millisecond, 30-80 ms apart: queues that build at
    once and drain between bursts."""
    rng = np.random.default_rng(seed)
    out: list[float] = []
    t = 0.0
    while len(out) < n:
        size = int(rng.integers(10, 41))
        out.extend(sorted(t + rng.uniform(0.0, 0.001, size)))
        t += float(rng.uniform(0.03, 0.08))
    return out[:n]


CASES: dict[str, tuple[Callable[[], list[float]], Knobs]] = {
    # Below capacity: the timeout, and the wait skipped once no other request is expected.
    "300/s batch 8, 2 ms": (lambda: poisson(300, 2000, 1), Knobs(8, 2.0, 1, 1, 1)),
    "a trickle, batch 8, 8 ms": (lambda: poisson(40, 600, 2), Knobs(8, 8.0, 1, 1, 1)),
    "900/s batch 32, 4 ms": (lambda: poisson(900, 2000, 3), Knobs(32, 4.0, 1, 1, 1)),
    "1500/s two instances, batch 4, 1 ms": (lambda: poisson(1500, 2000, 4), Knobs(4, 1.0, 2, 1, 1)),
    # Overload: refusals on arrival (the fastest pace cannot make it) and at a batch's start.
    "1500/s eager batch 8": (lambda: poisson(1500, 900, 5), Knobs(8, 0.0, 1, 1, 1)),
    "3000/s batch 32, 2 ms": (lambda: poisson(3000, 2000, 6), Knobs(32, 2.0, 1, 1, 1)),
    "bursts, two instances, batch 16, 2 ms": (lambda: bursts(2000, 7), Knobs(16, 2.0, 2, 1, 1)),
}


@functools.cache
def batcher_run(case: str) -> BatcherRun:
    """The gateway's batcher over a case (each case runs once per session)."""
    trace, knobs = CASES[case]
    return run_batcher(trace(), knobs, two_cores, deadline_s=DEADLINE_S)


@pytest.mark.parametrize("case", list(CASES))
def test_the_simulation_batches_and_refuses_as_the_batcher_does(case: str) -> None:
    trace, knobs = CASES[case]
    arrivals = trace()
    real = batcher_run(case)
    simulated = BatcherSim(knobs, BatchTimes(two_cores), slo_s=DEADLINE_S)
    latencies = simulated.run(arrivals)

    assert real.batch_rows == [rows for _, rows in simulated.batches]
    assert (
        max(abs(a - b) for (a, _), (b, _) in zip(real.starts, simulated.batches, strict=True))
        < CLOCK_S
    )
    refused = {i for i, s in enumerate(latencies) if math.isinf(s)}
    assert refused == set(real.refusals)
    served = [i for i in range(len(arrivals)) if i not in refused]
    assert max(abs(real.latencies_s[i] - latencies[i]) for i in served) < CLOCK_S


def test_each_case_exercises_what_it_is_named_for() -> None:
    """The cases reach the rule's branches: batches that left full, on their timeout and with
    no arrival expected; refusals on arrival and at a batch's start."""
    triggers: set[str] = set()
    reasons: set[str] = set()
    for case in CASES:
        run = batcher_run(case)
        triggers |= {b.fill.trigger for b in run.batches}
        reasons |= {_when_refused(why) for why in run.refusals.values()}
    assert triggers == {"full", "timeout", "no_arrival_expected"}
    assert reasons == {"on arrival", "at its batch's start"}


def _when_refused(message: str) -> str:
    if "deadline cannot be met" in message:
        return "on arrival"
    if "takes up to about" in message:
        return "at its batch's start"
    return message


def test_the_replay_over_measured_samples_is_the_same_simulation() -> None:
    """``replay.simulate`` (what the agent's queueing model calls) with one sample per batch
    size is the batcher's run on those batch times."""
    arrivals = poisson(1500, 900, 5)
    knobs = Knobs(8, 1.0, 2, 1, 1)
    samples = {(2, 1): {rows: [two_cores(rows)] for rows in range(1, 9)}}
    replayed = simulate(arrivals, knobs, ServiceTimes(samples), slo_s=DEADLINE_S)
    real = run_batcher(arrivals, knobs, two_cores, deadline_s=DEADLINE_S)
    assert {i for i, s in enumerate(replayed) if math.isinf(s)} == set(real.refusals)
    finite = [(a, b) for a, b in zip(real.latencies_s, replayed, strict=True) if math.isfinite(b)]
    assert max(abs(a - b) for a, b in finite) < CLOCK_S


CLOSED_LOOPS: dict[str, tuple[int, Knobs]] = {
    "32 clients, eager, one instance": (32, Knobs(32, 0.0, 1, 1, 1)),
    "32 clients, batch 16 on two instances": (32, Knobs(16, 0.0, 2, 1, 1)),
    "32 clients, batch 8, 1 ms, two instances": (32, Knobs(8, 1.0, 2, 1, 1)),
    # More clients than a batch: the requests left behind leave once their timeout has run out,
    # as the instance frees, before the clients it answered send again.
    "12 clients, batch 8, 4 ms": (12, Knobs(8, 4.0, 1, 1, 1)),
    # Fewer clients than a batch: once all are inside, none is expected, and the batch leaves.
    "20 clients, batch 64, 8 ms": (20, Knobs(64, 8.0, 1, 1, 1)),
    "a lone client, batch 8, 2 ms": (1, Knobs(8, 2.0, 1, 1, 1)),
}


@pytest.mark.parametrize("case", list(CLOSED_LOOPS))
def test_the_closed_loop_simulation_serves_what_the_batcher_serves(case: str) -> None:
    """The agent's closed-loop prediction (``replay.closed_loop_throughput``, with no cost of
    reading requests, which the virtual loop cannot charge) against the batcher's answers a
    second over the last three of four virtual seconds: within 1%. The batcher's own rule
    (``ArrivalEstimate``) sends a lone client's request at once; the closed-loop simulation
    waited out the timeout each time and put it at 0.57x."""
    clients, knobs = CLOSED_LOOPS[case]
    real = run_closed_loop(clients, knobs, two_cores, seconds=4.0)
    settled = [(at, rows) for at, rows in real.starts if at >= 1.0]
    span = settled[-1][0] - settled[0][0]
    served = sum(rows for _, rows in settled[:-1]) / span
    predicted = closed_loop_throughput(clients, knobs, two_cores, 0.0)
    assert predicted is not None
    assert predicted == pytest.approx(served, rel=0.01)


@dataclass(frozen=True)
class _Stream:
    """One model's traffic for the bench's whole-gateway replay."""

    arrivals_s: np.ndarray
    times: ServiceTimes
    slo_s: float


@pytest.mark.parametrize("case", list(CASES))
def test_the_bench_replay_with_no_loop_costs_batches_as_the_batcher_does(case: str) -> None:
    """``iotgw bench tuner``'s replay of a whole gateway (``benchmarks.tuner.serial_loop``: one
    event loop and shared cores around each model's batcher), with nothing charged to the loop
    and cores to spare, is the batcher: the same refusals and latencies."""
    trace, knobs = CASES[case]
    arrivals = trace()
    setting = (knobs.concurrency, knobs.intra_op_threads)
    samples = {setting: {rows: [two_cores(rows)] for rows in range(1, knobs.max_batch_size + 1)}}
    stream = _Stream(np.asarray(arrivals), ServiceTimes(samples), DEADLINE_S)
    replayed = serial_loop.replay([stream], [knobs], cores=64).latencies[0]
    real = batcher_run(case)
    assert {i for i, s in enumerate(replayed) if math.isinf(s)} == set(real.refusals)
    finite = [(a, b) for a, b in zip(real.latencies_s, replayed, strict=True) if math.isfinite(b)]
    assert max(abs(a - b) for a, b in finite) < CLOCK_S
