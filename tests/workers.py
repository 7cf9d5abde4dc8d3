"""What the tests do differently under pytest-xdist's workers (``./scripts/test.sh`` runs two,
``--dist loadgroup``): which tests share a worker, and where what a run builds once is built."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
# What loads the cores on purpose: the benchmarks' quick runs and the agent's live tests (each
# a gateway under load). Under pytest-xdist (./scripts/test.sh runs two workers) they run one at
# a time in one worker while the other takes the rest, as they would beside any other process.
LOADS_THE_CORES = (
    TESTS / "benchmarks",
    TESTS / "rrl" / "test_online.py",
    TESTS / "rrl" / "test_budget.py",
)


def run_folder(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """A temporary folder for what a test run builds once: under pytest-xdist the run's own,
    shared by its workers (whose builder, ``models.atomic_dir.build_once``, is safe when two build
    at once), else this session's."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # A worker's base folder is popen-gwN inside the run's: its parent is this run's alone.
        return tmp_path_factory.getbasetemp().parent / name
    return tmp_path_factory.mktemp(name)


def group_for_workers(items: list[pytest.Item]) -> None:
    """For pytest-xdist's ``--dist loadgroup``: the tests that load the cores are one group,
    scheduled first since it is the longest; every other module is a group of its own, so that
    its fixtures are set up once, in one worker."""
    loaded: list[pytest.Item] = []
    rest: list[pytest.Item] = []
    for item in items:
        if any(item.path.is_relative_to(where) for where in LOADS_THE_CORES):
            item.add_marker(pytest.mark.xdist_group("loads-the-cores"))
            loaded.append(item)
        else:
            item.add_marker(pytest.mark.xdist_group(str(item.path.relative_to(TESTS))))
            rest.append(item)
    items[:] = loaded + rest
