"""How measurements are reported: the results JSON, its timestamp, repeated figures and the
printed table (the rules are in ``/work/shared/benchmarks.md``).

Ground floor: imports nothing of the project but ``models.machine`` (itself a leaf), so every
package may use it; ``benchmarks.common`` re-exports these names for the benchmarks.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from models.machine import load_average

# The checkout's benchmarks/results: where every results file goes unless told otherwise.
RESULTS_DIR = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def default_results_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """``$IOTGW_RESULTS_DIR``; else the checkout's ``benchmarks/results`` when running from a
    checkout; else ``./iotgw-results`` (an installed package has no checkout to write into,
    and its own folder in site-packages is no place for results)."""
    if environ.get("IOTGW_RESULTS_DIR"):
        return Path(environ["IOTGW_RESULTS_DIR"])
    if (RESULTS_DIR.parents[1] / "pyproject.toml").is_file():
        return RESULTS_DIR
    return Path.cwd() / "iotgw-results"


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


# -- results -------------------------------------------------------------------------------


def now_iso() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def results_path(name: str, *, quick: bool, out_dir: Path | None) -> Path:
    directory = default_results_dir() if out_dir is None else Path(out_dir)
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
