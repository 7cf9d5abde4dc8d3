"""The offline testbed: a profile table (``iotgw profile``) replayed as an environment.

A decision interval (``interval_s``, a few seconds) is longer than a profile window (a fraction of
a second, so that the whole grid can be measured), so ``Testbed.measure(config, load)`` replays an
interval as ``round(interval_s / window_s)`` of the windows recorded for that configuration at
that load, drawn at random with replacement, and merged: counts summed, latency percentiles and
CPU averaged over the drawn windows. A measurement in the testbed is thus made of real
measurements of this machine, and its noise is the real spread between windows, shrunk by the
interval's length as independent windows would shrink it (``interval_s=0`` replays single
windows, the raw spread). The truth of a configuration (what gaps are computed against) is the
mean of the objective over its recorded windows, which is what the merged measurements average
to, and the oracle's objective is the smallest truth of the grid.

When the profile recorded each window's latencies (``samples``, profiles since the long-window
plan), latency figures are not averaged but pooled, as a decision interval pools its requests:
the merged p95 is the p95 of every latency of the drawn windows, and the truth is the objective
of all of the cell's windows pooled (one p95 over 90+ requests instead of the mean of a few p95s
of 10: a small window's p95 is close to its maximum, so averaging them measures the tail of
the tail). Counts add up either way.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from models.knobs import Knobs
from rrl.tuners.measurement import Measurement
from rrl.tuners.objective import Objective
from rrl.tuners.space import ConfigSpace
from rrl.tuners.workload import WorkloadState


@dataclass(frozen=True, slots=True)
class Load:
    rate_per_s: float
    rows_per_request: int = 1

    def __str__(self) -> str:
        return f"{self.rate_per_s:g}/s x{self.rows_per_request}"


class ProfileTable:
    """The windows of every (load, configuration) cell as one array: ``windows[load, flat, k]``
    holds window k's fields (``fields``) as float64 (NaN where a figure does not exist, e.g. a
    latency when nothing was answered)."""

    def __init__(self, doc: dict[str, Any], *, allow_partial: bool = False) -> None:
        self.doc = {k: v for k, v in doc.items() if k != "cells"}
        self.model: str = doc["model"]
        self.slo_ms: float = float(doc["slo_ms"])
        self.cores: int = int(doc["cores"])
        self.space = ConfigSpace.from_description(doc["space"])
        self.loads = tuple(
            Load(float(x["rate_per_s"]), int(x["rows_per_request"])) for x in doc["loads"]
        )
        self.fields: tuple[str, ...] = tuple(doc["window_fields"])
        n_windows = max((len(c["windows"]) for c in doc["cells"]), default=0)
        self.windows = np.full(
            (len(self.loads), self.space.size, n_windows, len(self.fields)), np.nan
        )
        seen = np.zeros((len(self.loads), self.space.size), dtype=bool)
        # Latencies of each window (ms), where the profile recorded them: pooled by merges.
        sampled = bool(doc["cells"]) and all("samples" in cell for cell in doc["cells"])
        samples: dict[tuple[int, int], list[np.ndarray]] = {}
        for cell in doc["cells"]:
            b, t, c, i, o = cell["config"]
            flat = self.space.flat(Knobs(int(b), float(t), int(c), int(i), int(o)))
            rows = np.array(
                [[np.nan if v is None else v for v in w] for w in cell["windows"]], dtype=float
            )
            self.windows[cell["load"], flat, : len(rows)] = rows
            seen[cell["load"], flat] = True
            if sampled:
                samples[cell["load"], flat] = [np.asarray(w, dtype=float) for w in cell["samples"]]
        self.samples = samples if sampled else None
        self.missing = int((~seen).sum())
        if self.missing and not allow_partial:
            raise ValueError(
                f"profile of {self.model} lacks {self.missing} of {seen.size} cells "
                "(an interrupted run? finish it with iotgw profile --resume)"
            )
        self._measured = seen

    @classmethod
    def load(cls, path: Path, *, allow_partial: bool = False) -> ProfileTable:
        return cls(json.loads(Path(path).read_text()), allow_partial=allow_partial)

    def field(self, name: str) -> np.ndarray:
        """(loads, configurations, windows) of one window field."""
        return self.windows[..., self.fields.index(name)]

    def window_count(self, load: int, flat: int) -> int:
        return int(np.isfinite(self.field("offered")[load, flat]).sum())

    def measurement(self, load: int, flat: int, window: int) -> Measurement:
        w = dict(zip(self.fields, self.windows[load, flat, window].tolist(), strict=True))
        return Measurement(
            duration_s=w["duration_s"],
            offered=int(w["offered"]),
            completed=int(w["completed"]),
            p50_ms=w["p50_ms"],
            p95_ms=w["p95_ms"],
            p99_ms=w["p99_ms"],
            slo_violations=int(w["violations"]),
            rejected=int(w["rejected"]),
            mean_ms=w["mean_ms"],
            cpu_cores=w["cpu_cores"],
            rows_per_request=float(self.loads[load].rows_per_request),
        )

    def merged(self, load: int, flat: int, windows: list[int]) -> Measurement:
        """Windows ``windows`` of a cell as one measurement: latencies pooled over their
        requests when the profile recorded them, else averaged (``merge``)."""
        parts = [self.measurement(load, flat, k) for k in windows]
        if self.samples is None:
            return merge(parts)
        latencies = np.concatenate([self.samples[load, flat][k] for k in windows])
        return pooled(parts, latencies)

    def workload_state(self, load: int) -> WorkloadState:
        """Rate levels counted from the lowest profiled rate (level 0)."""
        base = min(x.rate_per_s for x in self.loads)
        spec = self.loads[load]
        return WorkloadState(
            round(math.log2(spec.rate_per_s / base)), round(math.log2(spec.rows_per_request))
        )

    @property
    def base_rate_per_s(self) -> float:
        return min(x.rate_per_s for x in self.loads)


def merge(windows: list[Measurement]) -> Measurement:
    """Consecutive windows as one measurement: counts add up, latency figures and CPU are
    averaged over the windows that have them (so the latency objective of the merge is the mean
    of the windows' objectives, up to windows where nothing was answered)."""
    if len(windows) == 1:
        return windows[0]
    answered = [w for w in windows if w.completed]

    def mean(values: list[float | None]) -> float:
        known = [v for v in values if v is not None and math.isfinite(v)]
        return float(np.mean(known)) if known else float("nan")

    cpu = [w.cpu_cores for w in windows]
    return Measurement(
        duration_s=sum(w.duration_s for w in windows),
        offered=sum(w.offered for w in windows),
        completed=sum(w.completed for w in windows),
        p50_ms=mean([w.p50_ms for w in answered]),
        p95_ms=mean([w.p95_ms for w in answered]),
        p99_ms=mean([w.p99_ms for w in answered]),
        slo_violations=sum(w.slo_violations for w in windows),
        rejected=sum(w.rejected for w in windows),
        mean_ms=mean([w.mean_ms for w in answered]),
        cpu_cores=None if any(c is None for c in cpu) else mean(cpu),
        rows_per_request=windows[0].rows_per_request,
    )


def pooled(windows: list[Measurement], latencies_ms: np.ndarray) -> Measurement:
    """Windows as one measurement whose latency figures come from all their answered requests'
    latencies (``latencies_ms``); counts add up and CPU is averaged, as in ``merge``."""
    counts = merge(windows)
    if latencies_ms.size == 0:
        return counts
    p50, p95, p99 = np.percentile(latencies_ms, [50, 95, 99]).tolist()
    mean = float(latencies_ms.mean())
    return dataclasses.replace(counts, p50_ms=p50, p95_ms=p95, p99_ms=p99, mean_ms=mean)


class Testbed:
    __test__ = False  # a testbed, not a test class (pytest collects names starting with Test)

    def __init__(
        self, table: ProfileTable, objective: Objective, *, seed: int, interval_s: float = 0.0
    ) -> None:
        self.table = table
        self.objective = objective
        self.interval_s = interval_s
        self.rng = np.random.default_rng(seed)

    @property
    def space(self) -> ConfigSpace:
        return self.table.space

    def reseeded(self, seed: int) -> Testbed:
        """The same table and objective with a random stream of its own, sharing this one's
        truths: they pool every cell's latencies, a second or so per profile, which an
        evaluation of thousands of runs should pay once."""
        twin = Testbed(self.table, self.objective, seed=seed, interval_s=self.interval_s)
        twin.__dict__["_truth"] = self._truth  # the cached_property's own slot
        return twin

    def measure(self, config: Knobs, load: int) -> Measurement:
        flat = self.space.flat(config)
        recorded = self.table.window_count(load, flat)
        window_s = float(np.nanmean(self.table.field("duration_s")[load, flat]))
        draws = max(1, round(self.interval_s / window_s)) if self.interval_s > 0 else 1
        windows = self.rng.integers(recorded, size=draws)
        return self.table.merged(load, flat, [int(k) for k in windows])

    @cached_property
    def _truth(self) -> tuple[np.ndarray, np.ndarray]:
        t = self.table
        mean = np.empty((len(t.loads), self.space.size))
        se = np.empty_like(mean)
        for load in range(len(t.loads)):
            for flat in range(self.space.size):
                config = self.space.at(flat)
                every = list(range(t.window_count(load, flat)))
                values = [self.objective(config, t.measurement(load, flat, k)) for k in every]
                if t.samples is None:
                    mean[load, flat] = float(np.mean(values))
                else:  # the objective of all windows pooled, what merged draws come close to
                    mean[load, flat] = self.objective(config, t.merged(load, flat, every))
                # The windows are the independent units (moments far apart): their spread says
                # how precisely the profile knows the truth, pooled or not.
                se[load, flat] = float(np.std(values, ddof=1) / np.sqrt(len(values)))
        return mean, se

    def truth(self, load: int) -> np.ndarray:
        """Mean objective of every configuration at ``load`` (flat order)."""
        return self._truth[0][load]

    def truth_error(self, load: int) -> np.ndarray:
        """Standard error of each truth: how precisely the profile knows it."""
        return self._truth[1][load]

    def indistinguishable(self, load: int) -> np.ndarray:
        """Configurations as good as the oracle as far as the profile knows it: within two
        standard errors of the oracle's own truth. (The oracle is the luckiest of hundreds of
        noisy means, so a configuration a hair above it may well be as good.)"""
        truth, se = self.truth(load), self.truth_error(load)
        best = int(np.argmin(truth))
        return truth - truth[best] <= 2.0 * se[best]

    def oracle(self, load: int) -> tuple[Knobs, float]:
        truth = self.truth(load)
        best = int(np.argmin(truth))
        return self.space.at(best), float(truth[best])

    def gap(self, config: Knobs, load: int) -> float:
        """How much worse than the oracle ``config`` is, as a fraction of the oracle's value."""
        _, best = self.oracle(load)
        return float(self.truth(load)[self.space.flat(config)] / best - 1.0)
