"""What the tests do differently under pytest-xdist's workers (``IOTGW_TEST_WORKERS=2
./scripts/test.sh`` runs two, ``--dist loadscope``): which tests share a worker, and where
what a run builds once is built."""

from __future__ import annotations

import os
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


def scope_of(nodeid: str) -> str:
    """The unit a worker runs whole: the tests that load the cores together, else the test's
    module, so that a module's fixtures are set up once and a document's blocks (each may read
    what the one before wrote) run in order in one worker."""
    module = nodeid.split("::", 1)[0]
    path = ROOT / module
    if any(path.is_relative_to(where) for where in LOADS_THE_CORES):
        return LOADS_THE_CORES_SCOPE
    return module


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
