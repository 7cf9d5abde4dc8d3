"""What the tests do differently under pytest-xdist's workers (``./scripts/test.sh`` runs
two, ``--dist loadscope``; ``IOTGW_TEST_WORKERS=0`` one process): which tests share a worker,
which run alone, and where what a run builds once is built."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).parent
ROOT = TESTS.parent
# What loads the cores on purpose: the benchmarks' quick runs and the agent's live tests (each
# a gateway under load). They take turns in one worker while the other runs the rest, as they
# would beside any other process; two at once would starve each other's gateways.
LOADS_THE_CORES = (
    TESTS / "benchmarks",
    TESTS / "rrl" / "test_online.py",
    TESTS / "rrl" / "test_budget.py",
)
LOADS_THE_CORES_SCOPE = "tests that load the cores"
# What needs cores to spare: the agent's live tests assert what its gate decided, and the gate's
# queueing model runs in a process at SCHED_IDLE (rrl.agent.model_agent.lowest_priority), which
# gets a core only when one would otherwise idle. Beside a worker that keeps both cores busy it
# may not run for minutes (in one two-worker run neither agent of test_budget.py measured a
# window in its 10 s of load; beside two processes that burn a core each, a screening of the
# grid that takes 0.6 s on a free machine had not ended after 50 s). So each of these runs
# alone: the other worker waits between its tests (``turn``).
NEEDS_SPARE_CORES = (
    TESTS / "rrl" / "test_online.py",
    TESTS / "rrl" / "test_budget.py",
)


def _under(nodeid: str, places: tuple[Path, ...]) -> bool:
    path = ROOT / nodeid.split("::", 1)[0]
    return any(path.is_relative_to(where) for where in places)


def scope_of(nodeid: str) -> str:
    """The unit a worker runs whole: the tests that load the cores together, else the test's
    module, so that a module's fixtures are set up once and a document's blocks (each may read
    what the one before wrote) run in order in one worker."""
    if _under(nodeid, LOADS_THE_CORES):
        return LOADS_THE_CORES_SCOPE
    return nodeid.split("::", 1)[0]


@contextlib.contextmanager
def turn(config: pytest.Config, nodeid: str) -> Iterator[None]:
    """Hold a test's turn, setup and teardown included: under pytest-xdist a test in
    ``NEEDS_SPARE_CORES`` runs while no other worker runs one, the rest side by side. Outside
    xdist there is one process and nothing to wait for.

    A readers-writer lock on two files of the run's folder, both workers' ``flock``: every test
    passes the turnstile and shares the room; one that runs alone keeps the turnstile while it
    waits for the room to empty and while it runs, so the other worker's next test waits at the
    turnstile instead of slipping in (a process that dies releases its locks)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    # A worker's base folder is popen-gwN inside the run's (``run_folder``).
    folder = Path(config.getoption("basetemp")).parent
    alone = _under(nodeid, NEEDS_SPARE_CORES)
    with (
        (folder / ".turnstile.lock").open("a") as turnstile,
        (folder / ".room.lock").open("a") as room,
    ):
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        if alone:
            fcntl.flock(room, fcntl.LOCK_EX)
        else:
            fcntl.flock(room, fcntl.LOCK_SH)
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        yield  # both files close afterwards, which releases what is held


def make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist's ``loadscope`` scheduling with ``scope_of`` as its scope. Its largest unit
    goes first (the tests that load the cores: the longest too), and a worker takes another
    unit only when it is nearly through its own."""
    # Imported here: only a run under pytest-xdist gets this far (the GPU lane has no xdist).
    from xdist.scheduler import LoadScopeScheduling

    class ByScope(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return ByScope(config, log)


def run_folder(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """A temporary folder for what a test run builds once: under pytest-xdist the run's own,
    shared by its workers (whose builder, ``models.atomic_dir.build_once``, is safe when two
    build at once), else this session's."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # A worker's base folder is popen-gwN inside the run's: its parent is this run's alone.
        return tmp_path_factory.getbasetemp().parent / name
    return tmp_path_factory.mktemp(name)
