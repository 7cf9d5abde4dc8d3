"""Running a benchmark command from a test: its own limit sits under pytest's, so a hang fails
with the benchmark's last output, and the stack of each of its threads at that moment, instead
of pytest's bare timeout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Final

import pytest

REPO_ROOT: Final = Path(__file__).resolve().parents[2]
# pytest's timeout (pyproject) is 300 s; this leaves time to collect and report the output.
BENCH_LIMIT_S: Final = 280.0
_TAIL: Final = 4000
# How long a hung command has to write its threads' stacks before it is killed.
_DUMP_S: Final = 10.0


def _text(stream: str | bytes | None) -> str:
    if stream is None:
        return ""
    return stream.decode(errors="replace") if isinstance(stream, bytes) else stream


def _tail(stream: str | bytes | None) -> str:
    return _text(stream)[-_TAIL:]


def _stacks(stderr: str | bytes | None) -> str:
    """The thread stacks faulthandler wrote on SIGABRT, whole: without the one line listing
    the extension modules loaded, which alone filled the tail and hid every stack (a hang of
    ``iotgw profile --quick`` in a clean clone's CI left only its main thread's last frames)."""
    lines = _text(stderr).splitlines()
    kept = [line for line in lines if not line.startswith("Extension modules:")]
    return "\n".join(kept)[-4 * _TAIL :]


def run_bench(
    *args: str, limit_s: float = BENCH_LIMIT_S, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m <args>`` from the repository root; fail the test on a hang or an error
    exit, either way with the tails of stdout and stderr. A hang ends with SIGABRT, on which
    Python's faulthandler (``PYTHONFAULTHANDLER``) writes every thread's stack to stderr: the
    failure then says where the command was waiting."""
    argv = [sys.executable, "-m", *args]
    child_env = {**(os.environ if env is None else env), "PYTHONFAULTHANDLER": "1"}
    with subprocess.Popen(
        argv,
        cwd=REPO_ROOT,
        env=child_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=limit_s)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            try:
                stdout, stderr = proc.communicate(timeout=_DUMP_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                stdout, stderr = proc.communicate()
            pytest.fail(
                f"{' '.join(args)} ran past {limit_s:.0f} s\n"
                f"stdout: {_tail(stdout)}\nstderr: {_stacks(stderr)}"
            )
    if proc.returncode != 0:
        pytest.fail(
            f"{' '.join(args)} exited {proc.returncode}\n"
            f"stdout: {_tail(stdout)}\nstderr: {_tail(stderr)}"
        )
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)
