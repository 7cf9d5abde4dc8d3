"""The queueing model's own process: it answers exactly what the model computes in place, and
every one of its threads, those its imports started included, runs only on CPU nobody else
wants (``SCHED_IDLE`` where Linux has it, and ``nice`` 10), so a gate asked as a burst begins
does not take the cores the runtime and the front end need."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from rrl.objective import make_objective
from rrl.online import MODEL_NICENESS, model_process
from rrl.queueing import Arrivals, QueueModel
from rrl.space import Config

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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_model_process_answers_as_in_place_and_runs_at_idle_priority() -> None:
    asks = [(Config(b, 0.0, c, 1, 1), Arrivals(300.0), None) for b in (1, 8, 32) for c in (1, 2)]
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
