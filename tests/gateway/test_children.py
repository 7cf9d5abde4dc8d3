"""The gateway's children start with no Python code run between fork and exec (where gRPC's
at-fork handlers aborted one embedded broker in a few hundred), and still die with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# Runs in its own interpreter: an at-fork handler, once registered, cannot be taken back.
# It records every child in which Python's at-fork handlers ran, starts one child the way the
# gateway does on each loop, and prints the child's pid while the child sleeps.
_PARENT = """
import asyncio, os, sys
import uvloop
import gateway.children as children

marker, mode, loop = sys.argv[1], sys.argv[2], sys.argv[3]
append = os.O_WRONLY | os.O_APPEND
os.register_at_fork(after_in_child=lambda: os.write(os.open(marker, append), b"x"))
if mode == "fallback":
    children._setpriv = lambda: None

async def start(seconds):
    argv, preexec = children.dying_with_parent(["sleep", seconds])
    return await asyncio.create_subprocess_exec(*argv, preexec_fn=preexec)

async def main():
    done = await start("0")
    assert await done.wait() == 0
    child = await start("60")
    print(child.pid, flush=True)
    await asyncio.sleep(60)

(uvloop.run if loop == "uvloop" else asyncio.run)(main())
"""


def _start_parent(tmp_path: Path, mode: str, loop: str) -> tuple[subprocess.Popen[str], int, Path]:
    marker = tmp_path / "forked-python"
    marker.write_bytes(b"")
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, str(marker), mode, loop],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )
    assert parent.stdout is not None
    line = parent.stdout.readline()
    if not line:
        parent.wait(10)
        pytest.fail(f"the parent exited with {parent.returncode} before starting its child")
    return parent, int(line), marker


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def _armed(pid: int, within_s: float) -> bool:
    """Whether the child runs ``sleep`` by now: the death signal is set (by ``setpriv``, or by
    the fallback's hook) before that exec, so a parent killed earlier, on a busy machine in
    the microseconds after it printed the pid, would leave a child that was never told."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "sleep":
                return True
        except FileNotFoundError:
            return False
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)


def _kill_parent_and_expect_the_child_gone(parent: subprocess.Popen[str], child: int) -> None:
    try:
        assert _armed(child, within_s=10), "the child never got to exec its command"
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        assert _gone(child, within_s=10), "the child outlived its SIGKILLed parent"
    finally:
        parent.kill()
        parent.wait(10)
        if not _gone(child, within_s=0):
            os.kill(child, signal.SIGKILL)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_child_runs_no_python_and_dies_with_the_killed_gateway(tmp_path: Path, loop: str) -> None:
    parent, child, marker = _start_parent(tmp_path, "setpriv", loop)
    _kill_parent_and_expect_the_child_gone(parent, child)
    if loop == "asyncio":  # uvloop runs them in every child it starts, as its own fork
        assert marker.read_bytes() == b""  # neither child ran Python's at-fork handlers


def test_without_setpriv_a_preexec_fn_still_ties_the_child_to_the_gateway(tmp_path: Path) -> None:
    parent, child, marker = _start_parent(tmp_path, "fallback", "asyncio")
    _kill_parent_and_expect_the_child_gone(parent, child)
    assert marker.read_bytes() == b"xx"  # the fallback forks Python: what setpriv avoids
