"""What every benchmark shares: machine description, repeated-run statistics, percentiles,
the results file, the printed table, and server subprocesses that always stop.

The rules these helpers serve are in ``/work/shared/benchmarks.md``: warm up, repeat (at least
five runs, median quoted, min and max shown), print a table, write
``benchmarks/results/<name>.json`` (``<name>.quick.json`` in ``--quick`` mode).
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as _dt
import importlib.metadata
import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

RESULTS_DIR = Path(__file__).resolve().parent / "results"
MIN_FULL_RUNS = 5

# Package name in the results -> distributions that may provide it (first one installed wins).
DEFAULT_PACKAGES: dict[str, tuple[str, ...]] = {
    "onnxruntime": ("onnxruntime", "onnxruntime-gpu"),
    "tensorflow": ("tensorflow", "tensorflow-cpu"),
    "aiohttp": ("aiohttp",),
    "numpy": ("numpy",),
}


# -- the machine ---------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    match = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    return match.group(1).strip() if match else platform.processor() or platform.machine()


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def package_versions(
    packages: Mapping[str, Sequence[str]] = DEFAULT_PACKAGES,
) -> dict[str, str | None]:
    """Installed version of each package (None when it is not installed). Reads distribution
    metadata only, so nothing heavy (TensorFlow) gets imported."""
    out: dict[str, str | None] = {}
    for name, dists in packages.items():
        out[name] = None
        for dist in dists:
            try:
                out[name] = importlib.metadata.version(dist)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    return out


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def machine_info(packages: Mapping[str, Sequence[str]] = DEFAULT_PACKAGES) -> dict[str, Any]:
    return {
        "cpu": cpu_model(),
        "cores": usable_cores(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": package_versions(packages),
        "load_average_at_start": load_average(),
    }


# -- statistics ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Repeated:
    """One figure measured ``runs`` times: the median is the figure quoted."""

    values: tuple[float, ...]

    @classmethod
    def of(cls, values: Iterable[float]) -> Repeated:
        vals = tuple(float(v) for v in values)
        if not vals:
            raise ValueError("a figure needs at least one run")
        return cls(vals)

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def min(self) -> float:
        return min(self.values)

    @property
    def max(self) -> float:
        return max(self.values)

    @property
    def runs(self) -> int:
        return len(self.values)

    def as_dict(self, digits: int = 6) -> dict[str, Any]:
        return {
            "median": round(self.median, digits),
            "min": round(self.min, digits),
            "max": round(self.max, digits),
            "runs": self.runs,
            "values": [round(v, digits) for v in self.values],
        }


def percentiles(
    samples: Sequence[float] | np.ndarray, qs: Sequence[float] = (50, 95, 99)
) -> dict[str, float]:
    """``{"p50": ..., "p95": ..., "p99": ...}`` of ``samples`` (NaN when there are none)."""
    arr = np.asarray(samples, dtype=np.float64)
    if arr.size == 0:
        return {f"p{q:g}": float("nan") for q in qs}
    values = np.percentile(arr, list(qs))
    return {f"p{q:g}": float(v) for q, v in zip(qs, values, strict=True)}


# -- results -------------------------------------------------------------------------------


def results_path(name: str, *, quick: bool, out_dir: Path | None) -> Path:
    directory = RESULTS_DIR if out_dir is None else Path(out_dir)
    return directory / (f"{name}.quick.json" if quick else f"{name}.json")


def _jsonable(value: Any) -> Any:
    if isinstance(value, Repeated):
        return value.as_dict()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and value != value:  # NaN is not JSON
        return None
    if isinstance(value, Path):
        return str(value)
    return value


def write_results(
    name: str,
    *,
    quick: bool,
    out_dir: Path | None,
    machine: dict[str, Any],
    summary: dict[str, Any],
    runs: list[dict[str, Any]],
    config: dict[str, Any],
    created: str | None = None,
    **extra: Any,
) -> Path:
    """Write the results JSON in the shape of benchmarks.md; returns its path."""
    machine = dict(machine)
    machine.setdefault("load_average_at_end", load_average())
    doc = {
        "benchmark": name,
        "created": created or now_iso(),
        "quick": quick,
        "machine": machine,
        "summary": summary,
        "runs": runs,
        "config": config,
        **extra,
    }
    path = results_path(name, quick=quick, out_dir=out_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_jsonable(doc), indent=1, allow_nan=False) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def now_iso() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


# -- the printed table ---------------------------------------------------------------------


def format_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[_cell(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for n, row in enumerate(cells):
        lines.append(
            "  ".join(
                c.rjust(w) if n and i else c.ljust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        if value != value:
            return "-"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.3f}"
    return str(value)


def fmt_repeated(r: Repeated, scale: float = 1.0) -> str:
    """``median [min-max]`` for a table cell."""
    return f"{_cell(r.median * scale)} [{_cell(r.min * scale)}-{_cell(r.max * scale)}]"


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


def machine_busy_seconds() -> float | None:
    """CPU seconds the whole machine has spent busy (all cores, every process), from
    /proc/stat; the difference over a run minus what the benchmark's own processes used is the
    load that other work put on the machine meanwhile."""
    try:
        with open("/proc/stat") as fh:
            fields = fh.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    # user nice system idle iowait irq softirq steal (guest time is already in user)
    values = [int(x) for x in fields[1:9]]
    busy = values[0] + values[1] + values[2] + values[5] + values[6] + values[7]
    return busy / os.sysconf("SC_CLK_TCK")
