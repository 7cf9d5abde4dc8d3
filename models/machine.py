"""The machine a process runs on: usable cores, CPU model, installed package versions, load.

Ground floor: imports nothing of the project, so every package may use it (the gateway's tuner
sizes thread counts with ``usable_cores``; evaluations and benchmarks describe the machine in
their results with ``machine_info``).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# Package name in the results -> distributions that may provide it (first one installed wins).
DEFAULT_PACKAGES: dict[str, tuple[str, ...]] = {
    "onnxruntime": ("onnxruntime", "onnxruntime-gpu"),
    "tensorflow": ("tensorflow", "tensorflow-cpu"),
    "aiohttp": ("aiohttp",),
    "numpy": ("numpy",),
}


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity), not the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    match = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    return match.group(1).strip() if match else platform.processor() or platform.machine()


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
