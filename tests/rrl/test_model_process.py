"""The queueing model's own process: it answers exactly what the model computes in place, and
every one of its threads, those its imports started included, runs only on CPU nobody else
wants (``SCHED_IDLE`` where Linux has it, and ``nice`` 10), so a gate asked as a burst begins
does not take the cores the runtime and the front end need. And the agent's simulations all go
there: an uncalibrated gate's and a trial's normalisation included, which once simulated in the
gateway's own process, holding the interpreter lock its event loop needs."""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from models.knobs import Knobs
from rrl.agent.gate import decide
from rrl.agent.model_agent import MODEL_NICENESS, model_process
from rrl.agent.policy import Policy
from rrl.agent.queueing import Arrivals, QueueModel
from rrl.tuners.objective import make_objective
from rrl.tuners.space import ConfigSpace

SERVICE = {1: [0.002] * 20, 8: [0.004] * 20, 32: [0.009] * 20}


def _model() -> QueueModel:
    model = QueueModel(make_objective("latency", slo_ms=100.0, cores=2), cores=2)
    for setting in ((1, 1), (2, 1)):
        model.observe_service(setting, SERVICE)
    return model


def _threads(pid: int) -> dict[int, tuple[int, int]]:
    """(nice, scheduling policy) of each thread of ``pid``, from /proc."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        out[int(task.name)] = (int(fields[16]), int(fields[38]))  # stat fields 19 and 41
    return out


@pytest.mark.skipif(
    not sys.platform.startswith("linux"),
    reason="reads the threads' priorities from /proc (Linux only)",
)
def test_the_model_process_answers_as_in_place_and_runs_at_idle_priority() -> None:
    asks = [(Knobs(b, 0.0, c, 1, 1), Arrivals(300.0), None) for b in (1, 8, 32) for c in (1, 2)]
    pool = model_process()
    try:
        remote = _model()
        remote.executor = pool
        predicted = remote.predict_many(asks)
        pid = pool.submit(os.getpid).result()
        threads = _threads(pid)
    finally:
        pool.shutdown()
    assert predicted == _model().predict_many(asks)  # simulated there, the same figures
    assert all(p is not None for p in predicted)
    assert remote.simulations > 0
    assert pid != os.getpid()
    assert len(threads) >= 1
    for tid, (nice, policy) in threads.items():
        assert nice == MODEL_NICENESS, tid
        assert policy == os.SCHED_IDLE, tid


def test_the_agents_simulations_all_run_where_the_model_sends_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A thread pool stands in for the model's process here: what is checked is where each
    # simulation runs, and a process would hide its callers' threads.
    where: list[int] = []
    simulate = QueueModel._simulate

    def recorded(self: QueueModel, key: object) -> object:
        where.append(threading.get_ident())
        return simulate(self, key)  # type: ignore[arg-type]

    monkeypatch.setattr(QueueModel, "_simulate", recorded)
    incumbent, other = Knobs(32, 0.0, 1, 1, 1), Knobs(8, 0.0, 2, 1, 1)
    with ThreadPoolExecutor(max_workers=1) as pool:
        model = _model()
        model.executor = pool
        assert not model.calibrated
        verdict = decide(model, Arrivals(300.0), incumbent, [other])
        assert verdict.incumbent is not None and verdict.candidate is None  # not proven yet
        uncalibrated = len(where)

        policy = Policy("m", space=ConfigSpace.for_machine(2), slo_ms=100.0, cores=2)
        policy.queue_model = _model()
        policy.queue_model.executor = pool
        # A trial window measured at 250/s, compared at 300/s through the model's ratio.
        normalised = policy._normalise(incumbent, 10.0, 250.0, 300.0)
    assert uncalibrated >= 1 and len(where) > uncalibrated
    assert normalised != 10.0 and normalised > 0
    assert threading.get_ident() not in where


def test_the_closed_loop_simulations_run_where_the_model_sends_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A grid's closed-loop simulations, asked in one go after the service times moved: in the
    # gateway's process they held the interpreter lock its event loop needs.
    where: list[int] = []
    simulate = QueueModel._closed_loop_ms

    def recorded(self: QueueModel, config: Knobs, population: int) -> float | None:
        where.append(threading.get_ident())
        return simulate(self, config, population)

    monkeypatch.setattr(QueueModel, "_closed_loop_ms", recorded)
    grid = [Knobs(b, t, c, 1, 1) for b in (8, 32) for t in (0.0, 2.0) for c in (1, 2)]
    with ThreadPoolExecutor(max_workers=1) as pool:
        model = _model()
        model.executor = pool
        there = model.closed_loop_many(grid, 32)
        assert model.closed_loop_many(grid, 32) == there  # the second time from the cache
    assert len(where) == len(grid) and threading.get_ident() not in where
    assert there == [_model().closed_loop_ms(c, 32) for c in grid]  # the same figures
    assert all(ms is not None for ms in there)
