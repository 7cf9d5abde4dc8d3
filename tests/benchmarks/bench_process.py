"""Running a benchmark command from a test: its own limit sits under pytest's, so a hang fails
with the benchmark's last output instead of pytest's bare timeout."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Final

import pytest

REPO_ROOT: Final = Path(__file__).resolve().parents[2]
# pytest's timeout (pyproject) is 300 s; this leaves time to collect and report the output.
BENCH_LIMIT_S: Final = 280.0
_TAIL: Final = 4000


def _tail(stream: str | bytes | None) -> str:
    if stream is None:
        return ""
    text = stream.decode(errors="replace") if isinstance(stream, bytes) else stream
    return text[-_TAIL:]


def run_bench(
    *args: str, limit_s: float = BENCH_LIMIT_S, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m <args>`` from the repository root; fail the test on a hang or an error
    exit, either way with the tails of stdout and stderr."""
    argv = [sys.executable, "-m", *args]
    try:
        proc = subprocess.run(
            argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=limit_s
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"{' '.join(args)} ran past {limit_s:.0f} s\n"
            f"stdout: {_tail(exc.stdout)}\nstderr: {_tail(exc.stderr)}"
        )
    if proc.returncode != 0:
        pytest.fail(
            f"{' '.join(args)} exited {proc.returncode}\n"
            f"stdout: {_tail(proc.stdout)}\nstderr: {_tail(proc.stderr)}"
        )
    return proc
