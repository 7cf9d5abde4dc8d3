"""Under two pytest-xdist workers, a test that needs cores to spare runs alone
(``tests.workers.turn``): it waits for the other worker's test to end, and the other worker's
next test waits for it."""

from __future__ import annotations

import fcntl
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.workers import NEEDS_SPARE_CORES, ROOT, scope_of, turn

ALONE = f"{NEEDS_SPARE_CORES[0].relative_to(ROOT)}::test_x"
SHARED = "tests/gateway/test_http.py::test_y"
SETTLE_S = 0.3  # how long a thread that must not get in is given to (wrongly) get in


class _Config:
    def __init__(self, basetemp: Path) -> None:
        self._basetemp = basetemp

    def getoption(self, name: str) -> Any:
        assert name == "basetemp"
        return str(self._basetemp)


class _Test(threading.Thread):
    """A test holding its turn until released; ``inside`` is set once it is in."""

    def __init__(self, config: _Config, nodeid: str) -> None:
        super().__init__(daemon=True)
        self.config, self.nodeid = config, nodeid
        self.inside, self.release = threading.Event(), threading.Event()

    def run(self) -> None:
        with turn(self.config, self.nodeid):  # type: ignore[arg-type]
            self.inside.set()
            assert self.release.wait(30)


def _held(path: Path) -> bool:
    """Whether some holder keeps ``path`` locked exclusively (a shared lock is refused then)."""
    with path.open("a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False


def test_a_test_that_needs_spare_cores_runs_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    config = _Config(tmp_path / "popen-gw0")
    first, alone, second = _Test(config, SHARED), _Test(config, ALONE), _Test(config, SHARED)

    first.start()
    assert first.inside.wait(10)
    alone.start()
    # It waits at the room, holding the turnstile: the next test of the other worker cannot
    # slip in before it.
    for _ in range(100):
        if _held(tmp_path / ".turnstile.lock"):
            break
        time.sleep(0.05)
    assert _held(tmp_path / ".turnstile.lock")
    second.start()
    assert not alone.inside.wait(SETTLE_S) and not second.inside.is_set()

    first.release.set()
    assert alone.inside.wait(10)
    assert not second.inside.wait(SETTLE_S)

    alone.release.set()
    assert second.inside.wait(10)
    second.release.set()
    for t in (first, alone, second):
        t.join(10)


def test_tests_that_share_run_side_by_side(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    config = _Config(tmp_path / "popen-gw1")
    tests = [_Test(config, SHARED), _Test(config, SHARED)]
    for t in tests:
        t.start()
    assert all(t.inside.wait(10) for t in tests)
    for t in tests:
        t.release.set()
        t.join(10)


def test_outside_xdist_nothing_is_locked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    with turn(_Config(tmp_path / "popen-gw0"), ALONE):  # type: ignore[arg-type]
        assert not (tmp_path / ".room.lock").exists()


def test_the_live_agent_tests_take_turns_with_the_benchmarks() -> None:
    # In the worker that runs the benchmarks one after another, so never beside one either.
    assert {scope_of(f"{p.relative_to(ROOT)}::t") for p in NEEDS_SPARE_CORES} == {
        scope_of("tests/benchmarks/test_bench_quick.py::t")
    }
