"""The online agent's prediction: a configuration's latency under the arrivals seen now, without
running it.

The model is a GI/G/c queue with batch service behind one serial server, the gateway's batcher
and event loop (``rrl.offline.replay.simulate`` with ``serial``):

- **arrivals**: a renewal process with the rate and the burstiness the gateway sees now.
  Inter-arrival gaps are gamma distributed with mean ``1 / rate`` and squared coefficient of
  variation ``cv2`` (1: Poisson; above 1: bursty), i.e. shape ``1 / cv2``, scale ``cv2 / rate``;
- **batching**: a FIFO queue and ``c`` instances; a free instance leaves at once with what is
  queued, up to the max batch (timeout 0), or waits for a full batch at most the timeout;
  requests that already waited out the SLO are refused;
- **service**: a batch of ``b`` rows takes a time drawn from those the gateway measured for
  that batch-size bucket under the same instances and threads (``observe_service``). For a
  thread setting never measured, the times of the nearest measured one are scaled by how the
  cores are shared (``c x t`` threads on ``cores`` cores time-slice once ``c x t > cores``) and
  by the intra-op speed-up, and carry a wide relative uncertainty (``unmeasured_rel`` of the
  predicted p95);
- **the event loop**: every request's decoding and reply (``per_request_s``: the loop's CPU per
  request the gateway measured, ``observe_front_end``) and every batch's forming and fan-out
  (``per_batch_s``, a prior) are served one batch at a time: more instances do not make more
  front ends, and more, smaller batches cost the loop more. (``benchmarks.tuner.serial_loop``
  models the loop event by event with the cores shared; it costs 4x more CPU per prediction, and the
  gate's screening of a new workload state, run on the gateway's own cores, then doubled the
  agent's p95 in a burst on 2 cores.)

What the model still leaves out (the network, the client's side, the crossings' wake-ups) is
learned as an additive offset on p95: the median of ``measured p95 - predicted p95`` over the
recent windows (``calibrate``). The spread of those residuals is the model's proven error; a
candidate's uncertainty is that, plus the simulation's own sampling spread (``replicas``
traces), plus the relative uncertainty of derived service times. The gate (``rrl.agent.gate``) tries
a candidate only when its predicted gain clears it.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import numpy as np

from models.knobs import Knobs
from rrl.offline.replay import ServiceTimes, ThreadSetting, closed_loop_throughput, simulate
from rrl.tuners.measurement import Measurement
from rrl.tuners.objective import Objective

OVERLOADED = 0.01
"""A window with more than this share of its requests late or refused is overloaded: its p95
is capped by the refusals at the deadline and does not calibrate the model."""


@dataclass(frozen=True, slots=True)
class Arrivals:
    """The arrival process seen now: rate, burstiness (squared CV of the gaps), request rows."""

    rate_per_s: float
    cv2: float = 1.0
    rows_per_request: float = 1.0

    def bucket(self) -> tuple[int, int]:
        """A coarse key (quarter rate levels, burstiness in doublings): the arrivals the grid
        was last screened under."""
        rate = round(4 * math.log2(max(self.rate_per_s, 1e-3)))
        return rate, round(math.log2(max(self.cv2, 0.25)))

    def quantized(self) -> Arrivals:
        """The arrivals the model simulates: the rate to an eighth of a level (within 4.5%),
        burstiness to a doubling, rows to a quarter level. Finer differences are below the
        model's error, and a steady load then asks the same question every window, which the
        prediction cache (``QueueModel``) answers without simulating."""
        rate = 2.0 ** (round(8 * math.log2(max(self.rate_per_s, 1e-3))) / 8)
        cv2 = 2.0 ** round(math.log2(min(max(self.cv2, 0.05), 20.0)))
        rows = 2.0 ** (round(4 * math.log2(max(self.rows_per_request, 1.0))) / 4)
        return Arrivals(rate, cv2, rows)


@dataclass(frozen=True, slots=True)
class Prediction:
    """A configuration's expected figures under given arrivals, and how sure the model is."""

    config: Knobs
    p95_ms: float
    violation_fraction: float
    objective: float
    sd: float
    """Standard deviation of ``objective``: sampling spread, proven model error, and the
    uncertainty of service times not measured under this configuration's threads."""
    measured_threads: bool
    simulated_p95_ms: float = math.nan
    """The simulation's own p95, before the calibration's offset: what a window's residual is
    measured against."""

    def as_dict(self) -> dict[str, object]:
        return {
            "p95_ms": round(self.p95_ms, 3),
            "violation_fraction": round(self.violation_fraction, 4),
            "objective": round(self.objective, 3),
            "sd": round(self.sd, 3),
            "measured_threads": self.measured_threads,
        }


@dataclass(frozen=True, slots=True)
class QueueModelSettings:
    replicas: int = 3
    """Independent traces per prediction: their spread is the sampling uncertainty."""
    arrivals_per_trace: int = 600
    """Arrivals per trace (the screening of the whole grid uses a third as many)."""
    samples_kept: int = 60
    """Service times kept per (thread setting, batch bucket)."""
    residuals_kept: int = 12
    unmeasured_rel: float = 0.5
    """Relative uncertainty of service times derived for a thread setting never measured."""
    intra_op_speedup: float = 0.5
    """Service time scales as ``threads ** -speedup`` with intra-op threads (0.5: sub-linear; the
    small graphs served at the edge parallelise poorly)."""
    per_batch_s: float = 0.0003
    """The gateway's own cost per batch on its event loop (forming, the executor crossing and
    its wake-ups, concatenation, fan-out), which the service times it measures inside the
    runtime call leave out, and which the loop meter nets out of its cost per request: a prior
    (rrl/README.md, "The event loop's costs"), so batch size 1 is not predicted to keep up with
    any rate a tiny model's call time would allow, and a closed loop that the loop limits is
    predicted faster with fewer, fuller batches."""
    per_request_s: float = 0.0
    """The loop's CPU per request until the gateway has measured it (``observe_front_end``)."""
    min_error_ms: float = 0.2
    """Floor of the model's proven error on p95 (a handful of windows under-states it)."""
    min_residuals: int = 3
    """Windows that must have calibrated the model before it is trusted (``calibrated``)."""
    service_change: float = 0.25
    """A batch size's median service time must move this much (relative) from what the cached
    predictions were simulated with before they are dropped: the gateway reports its latest
    batches every window, and their medians wobble by a few percent on a steady load."""
    service_change_min_s: float = 0.00005
    """...and by at least this much (absolute): a tiny model's 10 us batches wobble by more than
    25% from window to window, which moves no prediction (the loop's cost per batch alone is 10
    times more) but would drop every cached one."""
    cache_size: int = 4096


class QueueModel:
    """Service times per thread setting, the arrivals, and the calibration (see the module).

    Predictions are cached per (configuration, quantized arrivals, replicas, trace length): the
    simulation's figures before the calibration offset, which is applied when one is read. The
    cache is dropped when the service times move (a thread setting measured for the first time,
    a batch size's median beyond ``service_change``): on a steady load the same questions then
    cost nothing. ``simulations`` counts the traces simulated, ``cache_hits`` the answers that
    needed none."""

    def __init__(
        self,
        objective: Objective,
        *,
        cores: int,
        settings: QueueModelSettings | None = None,
    ) -> None:
        self.objective = objective
        self.cores = cores
        self.settings = settings or QueueModelSettings()
        self._samples: dict[ThreadSetting, dict[int, deque[float]]] = {}
        self._residuals: deque[float] = deque(maxlen=self.settings.residuals_kept)
        self._cache: dict[CacheKey, Simulated | None] = {}
        self._closed_cache: dict[tuple[Knobs, int], float | None] = {}
        self._medians: dict[ThreadSetting, dict[int, float]] = {}
        """Per setting and batch size, the median service time the cache was simulated with."""
        self.per_request_s = self.settings.per_request_s
        """The event loop's CPU per request (``observe_front_end``)."""
        self.simulations = 0
        self.cache_hits = 0
        self.executor: Executor | None = None
        """Where ``predict_many`` runs (a process pool of one, set by the agent); None: here."""

    # -- what the gateway measured ----------------------------------------------------------

    def observe_service(
        self, setting: ThreadSetting, samples: Mapping[int, Sequence[float]]
    ) -> None:
        """Batch service times (seconds, per batch size) measured under ``setting`` (instances,
        intra-op threads). Replaces what was kept for the sizes given: the gateway reports its
        most recent batches, which already include what was reported before."""
        by_size = self._samples.setdefault(setting, {})
        for size, seconds in samples.items():
            if len(seconds):
                by_size[int(size)] = deque(
                    (float(s) for s in seconds), maxlen=self.settings.samples_kept
                )
        self._drop_cache_if_moved(setting)

    def _drop_cache_if_moved(self, setting: ThreadSetting) -> None:
        now = {size: float(np.median(v)) for size, v in self._samples[setting].items() if v}
        then = self._medians.get(setting)
        s = self.settings
        moved = then is None or any(
            size not in then
            or abs(median - then[size]) > max(s.service_change * then[size], s.service_change_min_s)
            for size, median in now.items()
        )
        if moved:
            self._medians[setting] = now
            self._forget()

    def _forget(self) -> None:
        """The service times or the loop's cost moved: every cached prediction goes."""
        self._cache.clear()
        self._closed_cache.clear()

    def observe_front_end(self, per_request_s: float) -> None:
        """The event loop's CPU per request, as the gateway measured it lately. The cached
        predictions are dropped when it moves by more than ``service_change``."""
        per_request_s = max(float(per_request_s), 0.0)
        then = self.per_request_s
        if abs(per_request_s - then) > self.settings.service_change * max(then, 1e-5):
            self.per_request_s = per_request_s
            self._forget()

    def measured_settings(self) -> list[ThreadSetting]:
        return sorted(s for s, by in self._samples.items() if by)

    def busy_cores(self, config: Knobs, measurement: Measurement) -> float | None:
        """The cores ``config``'s instances kept busy over ``measurement``'s window: the
        measured service time per row of its thread setting's recent batches (as they formed at
        the recent loads), times the rows that arrived per second, times each instance's
        intra-op threads; None until that setting is measured. What the joint core budget
        charges a model (``rrl.agent.budget``)."""
        by_size = self._samples.get((config.concurrency, config.intra_op_threads))
        rows = sum(size * len(seconds) for size, seconds in (by_size or {}).items())
        if not by_size or rows == 0:
            return None
        per_row_s = sum(sum(seconds) for seconds in by_size.values()) / rows
        rows_per_s = measurement.rate_per_s * max(measurement.rows_per_request, 1.0)
        return rows_per_s * per_row_s * config.intra_op_threads

    def calibrate(self, predicted: Prediction, measurement: Measurement) -> float | None:
        """Record how far a prediction was from what its window measured; returns the residual
        (ms of p95, measured minus predicted before the offset). Not from a window that was,
        or was predicted to be, overloaded: its p95 is capped by refusals at the deadline, so
        it says nothing of what the model leaves out."""
        if max(measurement.violation_fraction, predicted.violation_fraction) > OVERLOADED:
            return None
        simulated = predicted.simulated_p95_ms
        if math.isnan(simulated):
            simulated = predicted.p95_ms - self.offset_ms()
        residual = measurement.p95_ms - simulated
        self._residuals.append(residual)
        return residual

    @property
    def calibrated(self) -> bool:
        """Whether enough windows proved the model's error for the gate to act on it."""
        return len(self._residuals) >= self.settings.min_residuals

    def offset_ms(self) -> float:
        """What the model leaves out (front end, crossings): median residual of recent windows."""
        return float(np.median(self._residuals)) if self._residuals else 0.0

    def error_ms(self) -> float:
        """The model's proven error on p95: the normal-consistent median absolute deviation of
        the residuals (robust to a stray window), at least ``min_error_ms``."""
        floor = self.settings.min_error_ms
        if len(self._residuals) < 3:
            return max(floor, abs(self.offset_ms()))  # unproven: as wide as what it misses
        r = np.asarray(self._residuals)
        return max(floor, 1.4826 * float(np.median(np.abs(r - np.median(r)))))

    # -- prediction ---------------------------------------------------------------------------

    def predict_many(
        self, asks: Sequence[Ask], *, length: int | None = None
    ) -> list[Prediction | None]:
        """``predict`` for each (config, arrivals, replicas): from the cache, the rest simulated
        in the model's process when it has one (``executor``): the simulation is pure Python,
        and in a thread of the gateway's process it would hold the interpreter lock the event
        loop needs (measured: the gateway's p95 tripled under a burst while an agent only
        watched)."""
        keys = [self._key(c, a, r, length) for c, a, r in asks]
        known = {k: self._cache[k] for k in keys if k in self._cache}
        missing = [k for k in dict.fromkeys(keys) if k not in known]
        self.cache_hits += len(keys) - len(missing)
        if missing:
            if self.executor is None:
                simulated = _simulate_many(self, missing)
            else:
                simulated = self.executor.submit(_simulate_many, self, missing).result()
            fresh = dict(zip(missing, simulated, strict=True))
            self.simulations += sum(k[2] for k, v in fresh.items() if v is not None)
            if len(self._cache) + len(fresh) > self.settings.cache_size:
                self._forget()
            self._cache.update(fresh)
            known.update(fresh)
        return [self._compose(k, known[k]) for k in keys]

    def cached(self, config: Knobs, arrivals: Arrivals) -> Prediction | None:
        """The prediction with the default replicas when the cache holds it; never simulates."""
        key = self._key(config, arrivals, None, None)
        if key not in self._cache:
            return None
        self.cache_hits += 1
        return self._compose(key, self._cache[key])

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["executor"] = None  # the copy sent to the model's process simulates in place
        state["_cache"] = {}  # the caches stay with the agent
        state["_closed_cache"] = {}
        return state

    def predict(
        self,
        config: Knobs,
        arrivals: Arrivals,
        *,
        replicas: int | None = None,
        length: int | None = None,
    ) -> Prediction | None:
        """``config``'s figures under ``arrivals``; None before any service time is known.
        One ``predict_many``: a miss is simulated where every other is (the model's process
        when it has one), whoever asks."""
        return self.predict_many([(config, arrivals, replicas)], length=length)[0]

    def _key(
        self, config: Knobs, arrivals: Arrivals, replicas: int | None, length: int | None
    ) -> CacheKey:
        s = self.settings
        return (
            config,
            arrivals.quantized(),
            replicas or s.replicas,
            length or s.arrivals_per_trace,
        )

    def _simulate(self, key: CacheKey) -> Simulated | None:
        """The simulation behind a prediction: (p95 ms, violating share) per trace, before the
        calibration offset, and the relative uncertainty of the service times used."""
        config, arrivals, replicas, length = key
        derived = self._service_for(config, arrivals.rows_per_request)
        if derived is None or arrivals.rate_per_s <= 0:
            return None
        times, rel, measured = derived
        slo_s = self.objective.slo_ms / 1000.0
        per_batch = max(1, int(config.max_batch_size / max(arrivals.rows_per_request, 1.0)))
        as_requests = Knobs(
            per_batch,
            config.batch_timeout_ms,
            config.concurrency,
            config.intra_op_threads,
            config.inter_op_threads,
        )
        figures = []
        for seed in range(replicas):
            trace = self._trace(arrivals, seed, length)
            lat = np.asarray(
                simulate(trace, as_requests, times, slo_s=slo_s, seed=seed, serial=True)
            )
            figures.append(self._figures(lat, slo_s))
        return tuple(figures), rel, measured

    def _compose(self, key: CacheKey, simulated: Simulated | None) -> Prediction | None:
        """A prediction from a simulation, with the calibration as it stands now."""
        if simulated is None:
            return None
        config = key[0]
        figures, rel, measured = simulated
        offset = self.offset_ms()
        simulated_p95 = float(np.mean([f[0] for f in figures]))
        p95 = _calibrated(simulated_p95, offset)
        violating = float(np.mean([f[1] for f in figures]))
        objective = self._objective(config, p95, violating)
        per_trace = [self._objective(config, _calibrated(f[0], offset), f[1]) for f in figures]
        spread = float(np.std(per_trace, ddof=1)) if len(per_trace) > 1 else 0.0
        model_error = self.error_ms() + rel * p95
        sd = math.hypot(spread, self._objective_slope(config, p95, violating) * model_error)
        return Prediction(config, p95, violating, objective, sd, measured, simulated_p95)

    def _figures(self, lat: np.ndarray, slo_s: float) -> tuple[float, float]:
        served = lat[np.isfinite(lat)]
        violating = (np.count_nonzero(~np.isfinite(lat)) + np.count_nonzero(served > slo_s)) / max(
            lat.size, 1
        )
        p95 = float(np.percentile(served, 95)) * 1e3 if served.size else self.objective.slo_ms
        return p95, float(violating)

    def _objective(self, config: Knobs, p95_ms: float, violating: float) -> float:
        n = 1000
        probe = Measurement(
            duration_s=1.0,
            offered=n,
            completed=n,
            p50_ms=p95_ms,
            p95_ms=p95_ms,
            p99_ms=p95_ms,
            slo_violations=round(n * violating),
            rejected=0,
        )
        return self.objective(config, probe)

    def _objective_slope(self, config: Knobs, p95_ms: float, violating: float) -> float:
        """d objective / d p95 (1 for the latency objective): turns an error in ms into one in
        the objective's units."""
        return abs(
            self._objective(config, p95_ms + 1.0, violating)
            - self._objective(config, p95_ms, violating)
        )

    def _trace(self, arrivals: Arrivals, seed: int, n: int) -> list[float]:
        cv2 = min(max(arrivals.cv2, 0.05), 20.0)
        rng = np.random.default_rng(seed)
        gaps = rng.gamma(1.0 / cv2, cv2 / arrivals.rate_per_s, size=n)
        return np.cumsum(gaps).tolist()

    def _service_for(
        self, config: Knobs, rows_per_request: float
    ) -> tuple[ServiceTimes, float, bool] | None:
        """Service times for ``config``'s threads, in requests per batch: measured when that
        setting was, else derived from the nearest measured one (with its uncertainty)."""
        setting = (config.concurrency, config.intra_op_threads)
        known = self.measured_settings()
        if not known:
            return None
        if setting in known:
            source, scale, rel = setting, 1.0, 0.0
        else:
            source = min(known, key=lambda k: (abs(k[0] - setting[0]) + abs(k[1] - setting[1]), k))
            scale, rel = self._scale(source, setting), self.settings.unmeasured_rel
        rows = max(rows_per_request, 1.0)
        per_request = {
            max(1, int(size / rows)): [t * scale for t in seconds]
            for size, seconds in self._samples[source].items()
        }
        times = ServiceTimes(
            {setting: per_request},
            per_batch_s=self.settings.per_batch_s,
            per_request_s=self.per_request_s,
        )
        return times, rel, rel == 0.0

    def batch_seconds(self, config: Knobs, rows: int) -> float | None:
        """One batch of ``rows`` single-row requests under ``config``: the runtime's time
        (``runtime_seconds``) plus the gateway's costs per batch and per request; None before
        anything was measured."""
        seconds = self.runtime_seconds(config, rows)
        if seconds is None:
            return None
        return seconds + self.settings.per_batch_s + rows * self.per_request_s

    def runtime_seconds(self, config: Knobs, rows: int) -> float | None:
        """The runtime's call for one batch of ``rows`` single-row requests under ``config``'s
        threads (derived from the nearest measured setting when that one was not); None before
        anything was measured. Between measured batch sizes the medians are joined by straight
        lines; beyond the largest, linear in rows from it; below the smallest, the line through
        the two smallest, but never below rows in proportion to the smallest's time (with one
        size measured, that proportion): a gateway that has only run full batches has not
        measured its smaller ones, and the search that measures them ranks by what they might
        gain, not by the full batch's time."""
        found = self._service_for(config, 1.0)
        if found is None:
            return None
        times = found[0]
        setting = (config.concurrency, config.intra_op_threads)
        sizes = times.batch_sizes(setting)
        if not sizes:
            return None
        medians = [times.median_s(setting, size) for size in sizes]
        if rows >= sizes[-1]:
            seconds = medians[-1] * rows / sizes[-1]
        elif rows <= sizes[0]:
            seconds = medians[0] * rows / sizes[0]
            if len(sizes) > 1:
                slope = (medians[1] - medians[0]) / (sizes[1] - sizes[0])
                seconds = max(seconds, medians[0] - slope * (sizes[0] - rows))
        else:
            above = bisect.bisect_left(sizes, rows)
            lo, hi = sizes[above - 1], sizes[above]
            share = (rows - lo) / (hi - lo)
            seconds = medians[above - 1] + share * (medians[above] - medians[above - 1])
        return seconds

    def closed_loop_ms(self, config: Knobs, population: int) -> float | None:
        """Each request's time in a closed loop of ``population`` clients under ``config``
        (N / X by Little's law, X from ``rrl.offline.replay.closed_loop_throughput``: the
        event loop decodes the answered clients' requests one by one while the instances
        batch them, so a batch timeout's balance over the instances is in the figure); None
        before anything was measured."""
        return self.closed_loop_many([config], population)[0]

    def closed_loop_many(self, configs: Sequence[Knobs], population: int) -> list[float | None]:
        """``closed_loop_ms`` for each of ``configs``: from the cache, the rest simulated in
        the model's process when it has one, as ``predict_many`` does. A few milliseconds of
        pure Python each, a grid's worth after every change of the service times: in a thread
        of the gateway's process they held the interpreter lock the event loop needs, and the
        closed loop the agent was measuring answered far less for a second or more after each
        search (rrl/README, "Measurements behind the rules")."""
        if population < 1 or not self.measured_settings():
            return [None] * len(configs)
        missing = [c for c in dict.fromkeys(configs) if (c, population) not in self._closed_cache]
        if missing:
            if self.executor is None:
                computed = _closed_loop_many(self, missing, population)
            else:
                computed = self.executor.submit(
                    _closed_loop_many, self, missing, population
                ).result()
            for config, ms in zip(missing, computed, strict=True):
                self._closed_cache[(config, population)] = ms
        return [self._closed_cache[(c, population)] for c in configs]

    def _closed_loop_ms(self, config: Knobs, population: int) -> float | None:
        # The instance holds a batch for the runtime's call only: the loop's costs per request
        # and per batch are paid on the loop, one after another.
        throughput = closed_loop_throughput(
            population,
            config,
            lambda rows: self.runtime_seconds(config, rows),
            self.per_request_s,
            per_batch_s=self.settings.per_batch_s,
        )
        if throughput is None or throughput <= 0:
            return None
        return 1000.0 * population / throughput

    def _scale(self, source: ThreadSetting, target: ThreadSetting) -> float:
        """How much slower one batch runs under ``target`` than under ``source``: the cores'
        time-slicing between all threads, and the intra-op speed-up."""

        def slowdown(c: int, t: int) -> float:
            return max(1.0, c * t / self.cores) * t**-self.settings.intra_op_speedup

        return slowdown(*target) / slowdown(*source)


Ask = tuple[Knobs, Arrivals, int | None]  # (configuration, arrivals, replicas; None: default)
CacheKey = tuple[Knobs, Arrivals, int, int]
"""(configuration, quantized arrivals, replicas, trace length)."""
Simulated = tuple[tuple[tuple[float, float], ...], float, bool]
"""(p95 ms before the offset, violating share) per trace; relative uncertainty; measured."""


def _calibrated(simulated_ms: float, offset_ms: float) -> float:
    """A simulated p95 with the offset what the simulation leaves out adds. A negative offset
    (measured below simulated, lately, on the configurations that ran) never takes more than
    half of a simulated figure: an additive offset learned at one load would otherwise put a
    light load's p95 below zero."""
    return max(simulated_ms + offset_ms, simulated_ms / 2)


def _simulate_many(model: QueueModel, keys: Sequence[CacheKey]) -> list[Simulated | None]:
    return [model._simulate(k) for k in keys]


def _closed_loop_many(
    model: QueueModel, configs: Sequence[Knobs], population: int
) -> list[float | None]:
    return [model._closed_loop_ms(c, population) for c in configs]
