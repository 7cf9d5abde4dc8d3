"""What the documented commands write in the checkout stays out of ``git status``, and the
committed results folder is not caught by the same patterns."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout"
)


def _ignored(path: str) -> bool:
    done = subprocess.run(
        ["git", "-C", str(ROOT), "check-ignore", "-q", path], check=False, timeout=30
    )
    assert done.returncode in (0, 1), done  # 128: git could not answer
    return done.returncode == 0


@pytest.mark.parametrize(
    "path", ["results/poisson/summary.json", "traces/morning.csv", "sim-results/run/a.json"]
)
def test_what_the_documented_commands_write_is_ignored(path: str) -> None:
    assert _ignored(path)


def test_a_new_committed_result_is_not_ignored() -> None:
    assert not _ignored("benchmarks/results/new_experiment.json")
    assert not _ignored("device_sim/results/x.py")
