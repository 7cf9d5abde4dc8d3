"""What every benchmark shares: machine description, repeated-run statistics, percentiles,
the results file, the printed table, and server subprocesses that always stop.

The rules these helpers serve are in ``/work/shared/benchmarks.md``: warm up, repeat (at least
five runs, median quoted, min and max shown), print a table, write
``benchmarks/results/<name>.json`` (``<name>.quick.json`` in ``--quick`` mode).

The machine description, the results file and the table live on the ground floor
(``models.machine``, ``models.reporting``) because other packages write results too; they are
re-exported here so a benchmark finds all it needs in one module.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from models.machine import DEFAULT_PACKAGES as DEFAULT_PACKAGES
from models.machine import cpu_model as cpu_model
from models.machine import load_average as load_average
from models.machine import machine_info as machine_info
from models.machine import package_versions as package_versions
from models.machine import usable_cores as usable_cores
from models.reporting import RESULTS_DIR as RESULTS_DIR
from models.reporting import Repeated as Repeated
from models.reporting import fmt_repeated as fmt_repeated
from models.reporting import format_table as format_table
from models.reporting import now_iso as now_iso
from models.reporting import results_path as results_path
from models.reporting import write_results as write_results

MIN_FULL_RUNS = 5


def bench_parser(prog: str, description: str | None) -> argparse.ArgumentParser:
    """The arguments every benchmark's ``python -m`` takes: ``--quick`` and ``--out``."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--quick", action="store_true", help="seconds, to check it still works")
    p.add_argument("--out", type=Path, help="results directory (default benchmarks/results)")
    return p


@dataclass
class BenchRun:
    """One run of a benchmark, from its start: what its results file records besides the
    figures (when it began, the machine as it was then, the commit it ran: ``config.code``
    unless the benchmark sets its own), a log stamped with the seconds since the start, and
    the results file written at the end."""

    name: str
    quick: bool
    out_dir: Path | None
    created: str = field(default_factory=now_iso)
    machine: dict[str, Any] = field(default_factory=machine_info)
    started: float = field(default_factory=time.monotonic)
    code: str | None = field(default_factory=lambda: source_commit())

    @contextlib.contextmanager
    def workdir(self) -> Iterator[Path]:
        """A temporary folder for the run's files, removed at the end whatever happens."""
        prefix = f"iotgw-bench-{self.name}-"
        with tempfile.TemporaryDirectory(prefix=prefix, ignore_cleanup_errors=True) as tmp:
            yield Path(tmp)

    def wall_s(self) -> float:
        return round(time.monotonic() - self.started, 1)

    def log(self, msg: str) -> None:
        print(f"[{time.monotonic() - self.started:6.1f}s] {msg}", flush=True)

    def write(
        self, *, summary: dict[str, Any], runs: list[dict[str, Any]], config: dict[str, Any]
    ) -> Path:
        """The results file (``write_results``), its path printed last; returns the path."""
        path = write_results(
            self.name,
            quick=self.quick,
            out_dir=self.out_dir,
            machine=self.machine,
            summary=summary,
            runs=runs,
            config={"code": self.code, **config},
            created=self.created,
        )
        note_if_quick(self.quick)
        print(f"\nwrote {path}")
        return path


# Printed after a --quick run's figures: a target "missed" there is no finding.
QUICK_NOTE = (
    "\nThis was a --quick run: it checks that the benchmark still works, at loads, durations "
    "and repeats too small to be read against the targets, so a target_met (or *_met) of "
    "False above says nothing; run it without --quick to measure."
)


def note_if_quick(quick: bool) -> None:
    """After a --quick run's figures: ``QUICK_NOTE``."""
    if quick:
        print(QUICK_NOTE)


def print_summary(summary: Mapping[str, object]) -> None:
    """The summary figures as the last table of a benchmark's printout."""
    print("\nSummary")
    print(format_table(["figure", "value"], [[k, v] for k, v in summary.items()]))


# -- statistics ----------------------------------------------------------------------------


def percentiles(
    samples: Sequence[float] | np.ndarray, qs: Sequence[float] = (50, 95, 99)
) -> dict[str, float]:
    """``{"p50": ..., "p95": ..., "p99": ...}`` of ``samples`` (NaN when there are none)."""
    arr = np.asarray(samples, dtype=np.float64)
    if arr.size == 0:
        return {f"p{q:g}": float("nan") for q in qs}
    values = np.percentile(arr, list(qs))
    return {f"p{q:g}": float(v) for q, v in zip(qs, values, strict=True)}


# -- server subprocesses -------------------------------------------------------------------


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (prefer letting the server bind port 0 and report it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# Run as ``python -c _DIE_WITH_PARENT argv...``: asks Linux to SIGTERM the process when its
# parent dies (the setting survives the exec), then becomes ``argv``. So a server outlives
# neither a benchmark killed with SIGKILL nor one that crashed past its ``finally``.
_DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG\n"
    "os.getppid() == int(sys.argv[1]) or sys.exit(1)  # the parent is gone already\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


class ServerProcess:
    """A server in a subprocess (its own session, so it can be signalled as a group), with its
    output in a log file. ``wait_for_log`` polls that file for a pattern (e.g. the bound port).
    Stopped by ``stop()``, by leaving ``with``, at interpreter exit, and (Linux) when this
    process dies."""

    def __init__(
        self, argv: Sequence[str], *, log_path: Path, env: Mapping[str, str] | None = None
    ) -> None:
        self.argv = list(argv)
        self.log_path = log_path
        self._log = log_path.open("wb")
        launch = self.argv
        if sys.platform == "linux":
            launch = [sys.executable, "-c", _DIE_WITH_PARENT, str(os.getpid()), *self.argv]
        self.proc = subprocess.Popen(
            launch,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            start_new_session=True,
        )
        atexit.register(self.stop)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_for_log(self, pattern: str, timeout_s: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        regex = re.compile(pattern)
        while True:
            match = regex.search(self.log_text())
            if match:
                return match
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.argv[0]} exited with {self.proc.returncode} before logging "
                    f"{pattern!r}:\n{self.log_text()[-4000:]}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"no {pattern!r} in the server log after {timeout_s:g} s:\n"
                    f"{self.log_text()[-4000:]}"
                )
            time.sleep(0.05)

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM (the gateway drains), then SIGKILL after ``timeout_s``. Idempotent."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if not self._log.closed:
            self._log.close()
        atexit.unregister(self.stop)
        return self.proc.returncode

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def python_argv(module: str, *args: str) -> list[str]:
    """``python -m module args`` with this interpreter."""
    return [sys.executable, "-m", module, *args]


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` (all its threads), from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime, stime (fields 14, 15)


PROC_STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds of ``root`` and every process below it (the ingest processes)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += process_cpu_seconds(pid) or 0.0
        todo.extend(children.get(pid, []))
    return total


def source_commit(root: Path | None = None) -> str | None:
    """The commit of the checkout the benchmark runs from, ``+changes`` when tracked files
    differ from it (the figures are then not that commit's); None outside a git checkout."""
    where = root or Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=where, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}+changes" if changed else head or None


def machine_cpu_seconds() -> dict[str, float] | None:
    """The whole machine's CPU seconds (all cores) by kind since boot, from /proc/stat's first
    line: ``PROC_STAT_FIELDS`` (guest time is already counted in user)."""
    try:
        with open("/proc/stat") as fh:
            fields = fh.readline().split()
    except OSError:
        return None
    if len(fields) <= len(PROC_STAT_FIELDS) or fields[0] != "cpu":
        return None
    tick = os.sysconf("SC_CLK_TCK")
    return {k: int(v) / tick for k, v in zip(PROC_STAT_FIELDS, fields[1:], strict=False)}


def machine_busy_seconds() -> float | None:
    """CPU seconds the whole machine has spent busy (all cores, every process); the
    difference over a run minus what the benchmark's own processes used is the load that other
    work put on the machine meanwhile."""
    seconds = machine_cpu_seconds()
    if seconds is None:
        return None
    return sum(v for k, v in seconds.items() if k not in ("idle", "iowait"))
