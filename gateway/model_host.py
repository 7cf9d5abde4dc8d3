"""One served model version: its runtime instances, its batcher, its knobs and its state."""

from __future__ import annotations

import asyncio
import enum
import logging
import stat
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import numpy as np

from gateway.batching.batcher import Batcher, BatchRecord
from gateway.batching.instances import InstancePool, RuntimeFactory
from gateway.batching.watchdog import CallWatchdog, StuckCalls, WatchdogLimits
from gateway.errors import BadRequest, GatewayError, InternalError, ModelUnavailable
from gateway.inference_stats import InferenceStatistics
from gateway.metrics import GatewayMetrics
from gateway.request_stats import RequestStats
from models.knobs import InvalidKnobs, KnobLimits, Knobs
from models.repository import ModelConfig
from models.runtime import ModelMetadata, Threads
from models.window_stats import WindowStats

log = logging.getLogger("gateway.model")

# (relative path, size, mtime in ns) of every file of a version folder: a reload rebuilds a
# version only when this changed.
Fingerprint = tuple[tuple[str, int, int], ...]


def folder_fingerprint(directory: Path) -> Fingerprint:
    """What a version folder holds, file by file (links followed: the demo's are links)."""
    out = []
    for path in sorted(directory.rglob("*")):
        try:
            st = path.stat()
        except OSError:  # a dangling link or a file removed while the folder is read
            continue
        if stat.S_ISREG(st.st_mode):
            out.append((str(path.relative_to(directory)), st.st_size, st.st_mtime_ns))
    return tuple(out)


class ModelState(enum.StrEnum):
    LOADING = "LOADING"
    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"
    UNLOADING = "UNLOADING"


class ModelHost:
    def __init__(
        self,
        *,
        name: str,
        version: int,
        config: ModelConfig,
        factory: RuntimeFactory,
        executor: Executor,
        metrics: GatewayMetrics,
        limits: KnobLimits | None = None,
        watchdog: WatchdogLimits | None = None,
        knobs: Knobs | None = None,
        fingerprint: Fingerprint = (),
    ) -> None:
        self.name = name
        self.fingerprint = fingerprint  # of the version folder it was built from
        self.version = version
        self.config = config
        self.state = ModelState.LOADING
        self.reason = ""
        self._metrics = metrics
        self._labels = (name, str(version))
        b = config.batching
        self.limits = limits or KnobLimits(max_batch_size=config.max_batch_size)
        self._knobs = config.batching.knobs
        if knobs is not None:  # a reload keeps the knobs the tuner or an operator chose
            self._knobs = _carried(self._knobs, knobs, self.limits)
        self._watchdog = watchdog or WatchdogLimits()
        self._stuck_calls = self._watchdog.stuck_calls or StuckCalls(self._watchdog.max_stuck)
        self._pool = InstancePool(
            factory=factory,
            executor=executor,
            warmup_batch_sizes=tuple(sorted({1, b.max_batch_size})),
            stuck_calls=self._stuck_calls,
        )
        self._batcher = self._build_batcher(executor)
        self._replacing: set[asyncio.Task[None]] = set()
        self._knob_lock = asyncio.Lock()
        self._bind_metrics(metrics)
        # Arrivals, completions and refusals by time, for the windows of ``stats``.
        self._requests = RequestStats(slo_s=config.slo_ms / 1000.0)
        self.arrived_total = 0
        """Requests that reached ``infer`` since the start (the tuner's loop meter)."""
        self.batches_total = 0
        """Batches run since the start (the tuner's loop meter)."""
        self.statistics = InferenceStatistics()  # since loaded, as Triton's ModelStatistics
        # Requests inside ``infer``: a version swapped out is closed only once they are answered.
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def _build_batcher(self, executor: Executor) -> Batcher:
        label = f"{self.name}/{self.version}"
        return Batcher(
            name=label,
            pool=self._pool,
            watchdog=CallWatchdog(
                name=label,
                executor=executor,
                limit_s=self._watchdog.limit_s,
                on_stuck=self._batch_stuck,
            ),
            knobs=lambda: self._knobs,
            max_queue_size=self.config.batching.max_queue_size,
            on_batch=self._record_batch,
        )

    def _bind_metrics(self, metrics: GatewayMetrics) -> None:
        # The labelled children are looked up once: ``labels()`` costs a dict walk per call.
        self._request_children: dict[tuple[str, str], tuple[Any, Any]] = {}
        self._batch_rows = metrics.batch_size.labels(*self._labels)
        self._compute_seconds = metrics.compute_seconds.labels(*self._labels)
        self._queue_seconds = metrics.queue_seconds.labels(*self._labels)
        self._queue_depth_gauge = metrics.queue_depth.labels(*self._labels)

    @property
    def metadata(self) -> ModelMetadata:
        if self._pool.metadata is None:
            raise ModelUnavailable(
                f"model {self.name} version {self.version} is not loaded"
                + (f": {self.reason}" if self.reason else "")
            )
        return self._pool.metadata

    @property
    def knobs(self) -> Knobs:
        return self._knobs

    @property
    def ready(self) -> bool:
        return self.state is ModelState.READY

    @property
    def queue_depth(self) -> int:
        return self._batcher.queue_depth

    async def load(self) -> None:
        k = self._knobs
        try:
            await self._pool.start(k.concurrency, Threads(k.intra_op_threads, k.inter_op_threads))
        except Exception as exc:
            self.state = ModelState.UNAVAILABLE
            self.reason = str(exc)
            self._metrics.model_ready.labels(*self._labels).set(0)
            log.error("model %s version %d failed to load: %s", self.name, self.version, exc)
            return
        self._batcher.start()
        self.state = ModelState.READY
        self._metrics.model_ready.labels(*self._labels).set(1)
        self._publish_knobs()
        # One line per version is detail at start-up (the gateway logs how many loaded).
        log.debug("model %s version %d ready (%s)", self.name, self.version, self._describe())

    async def unload(self, *, publish: bool = True) -> None:
        """Stop serving and close the runtime instances; ``publish=False`` leaves the ready
        gauge to the host that replaces this one under the same labels."""
        self.state = ModelState.UNLOADING
        if publish:
            self._metrics.model_ready.labels(*self._labels).set(0)
        for task in self._replacing:
            task.cancel()
        await asyncio.gather(*self._replacing, return_exceptions=True)
        await self._batcher.stop()
        await self._pool.close()

    async def retire(self, drain_s: float, *, replaced: bool) -> None:
        """Unload once the requests already inside are answered (at most ``drain_s``). The
        caller has taken this host out of the lookup first, so no new request reaches it."""
        try:
            await asyncio.wait_for(self._idle.wait(), max(drain_s, 0.0))
        except TimeoutError:
            log.warning(
                "model %s version %d: %d request(s) still running after %.0f s are refused",
                self.name,
                self.version,
                self._in_flight,
                drain_s,
            )
        await self.unload(publish=not replaced)

    def refuse_early(self, unless: Callable[[], bool]) -> None:
        """Raise, before its body is decoded, the refusal a one-row request with the model's
        SLO as its budget would get now (queue full, or no batch could answer it in time);
        return when it would be admitted, and it is then decoded and admitted at its own rows
        as any other. A closed loop of clients beyond its deadlines sends each refused request
        again at once: decoding every one only to refuse it took 39% of the gateway's samples
        with vision_cnn at 128 connections (32,000 refusals in 20 s), the event loop's time the
        admitted requests wait behind. ``unless()`` (whether the body may name a budget of its
        own) is asked only of a request admission would refuse: it searches the body's bytes,
        which costs more than the admission check, so the admitted requests do not pay for it.
        A refusal is counted as ``infer`` counts one."""
        if self.state is not ModelState.READY:
            return  # ``infer`` gives the reason
        now = time.monotonic()
        try:
            self._batcher.check_arrival(rows=1, deadline=now + self.config.slo_ms / 1000.0)
        except GatewayError as exc:
            if unless():
                return
            self.arrived_total += 1
            self._requests.arrive(now, 1, self._in_flight + 1)
            self.record_rejection(exc.reason)
            raise

    async def infer(
        self,
        inputs: dict[str, np.ndarray],
        *,
        rows: int,
        timeout_s: float | None,
        priority: int,
        delivery_s: float = 0.0,
    ) -> tuple[dict[str, np.ndarray], float, float]:
        if self.state is not ModelState.READY:
            raise ModelUnavailable(
                f"model {self.name} version {self.version} is {self.state.value.lower()}"
                + (f": {self.reason}" if self.reason else "")
            )
        started = time.monotonic()
        self.arrived_total += 1
        budget = timeout_s if timeout_s is not None else self.config.slo_ms / 1000.0
        # The answer must be ready before the reply's own way to the client starts eating the
        # budget; never more than half of it, so one slow acknowledgement cannot refuse all.
        budget -= min(delivery_s, budget / 2)
        self._in_flight += 1
        self._requests.arrive(started, rows, self._in_flight)
        self._idle.clear()
        try:
            result = await self._batcher.submit(
                inputs, rows=rows, deadline=started + budget, priority=priority
            )
        except ModelUnavailable:
            raise
        except Exception as exc:
            reason = getattr(exc, "reason", None)
            if reason in ("queue_full", "deadline"):
                self.record_rejection(reason)
            raise
        finally:
            self._in_flight -= 1
            if not self._in_flight:
                self._idle.set()
        finished = time.monotonic()
        self._requests.complete(finished, finished - started, rows)
        return result

    async def set_knobs(self, new: Knobs) -> Knobs:
        """Set the knobs; returns once every one is in effect. Request-level knobs take effect
        from the next batch; thread and concurrency changes swap runtime instances. The
        tuner's way in: logged at DEBUG (its moves are on /admin/tuner and the dashboard)."""
        return await self._change(lambda _: new, logging.DEBUG)

    async def change_knobs(self, changes: Mapping[str, object]) -> Knobs:
        """Change some knobs by wire name; the others keep what they hold when the change
        takes the knob lock (two changes at once both land, one after the other). An
        operator's way in (the admin API): logged at INFO."""
        return await self._change(lambda current: current.with_changes(changes), logging.INFO)

    async def _change(self, to: Callable[[Knobs], Knobs], level: int) -> Knobs:
        async with self._knob_lock:
            old = self._knobs
            try:
                new = self.limits.check(to(old))
            except InvalidKnobs as exc:
                raise BadRequest(str(exc)) from exc
            if (new.concurrency, new.intra_op_threads, new.inter_op_threads) != (
                old.concurrency,
                old.intra_op_threads,
                old.inter_op_threads,
            ):
                try:
                    await self._pool.reconfigure(
                        concurrency=new.concurrency,
                        threads=Threads(new.intra_op_threads, new.inter_op_threads),
                    )
                except Exception as exc:
                    # The pool builds new instances before retiring old ones, so on failure the
                    # old ones still serve and the knobs stay as they were.
                    log.exception(
                        "model %s version %d: reconfiguration failed", self.name, self.version
                    )
                    raise InternalError(
                        f"model {self.name} version {self.version}: could not build runtime "
                        f"instances for {new.as_dict()}: {exc}; knobs unchanged"
                    ) from exc
            self._knobs = new
            self._publish_knobs()
            if new != old:
                log.log(
                    level,
                    "model %s version %d knobs: %s",
                    self.name,
                    self.version,
                    self._describe(),
                )
            return new

    def stats(self, window_s: float = 10.0) -> WindowStats:
        return self._requests.window(
            time.monotonic(),
            window_s,
            queue_depth=self._batcher.queue_depth,
            in_system=self._in_flight,
        )

    def completions_per_second(self, seconds: int) -> list[int]:
        """Requests answered in each of the last ``seconds`` whole seconds, oldest first."""
        return self._requests.completions_per_second(time.monotonic(), seconds)

    def service_samples(self) -> dict[int, tuple[float, ...]]:
        """Recent batch service times (seconds) by batch-size bucket: the tuner's queueing model."""
        return self._batcher.service_time.samples()

    def drain_time(self) -> float:
        """Seconds until this model's queue is worked off (at least 1): a retry hint."""
        return self._batcher.drain_time()

    def record_rejection(self, reason: str) -> None:
        """Count a request refused before computing (by reason, and for the tuner's stats)."""
        self._requests.reject(time.monotonic())
        self._metrics.rejections.labels(*self._labels, reason).inc()

    def record_request(self, transport: str, outcome: str, seconds: float) -> None:
        """Count one request. The labelled metric children are looked up once per
        (transport, outcome): prometheus-client's ``labels()`` costs microseconds per call,
        which adds up on the event loop at thousands of requests per second."""
        children = self._request_children.get((transport, outcome))
        if children is None:
            m = self._metrics
            children = (
                m.requests.labels(*self._labels, transport, outcome),
                m.latency_seconds.labels(*self._labels, transport),
            )
            self._request_children[(transport, outcome)] = children
        counter, latency = children
        counter.inc()
        latency.observe(seconds)
        self.statistics.request(outcome == "ok", seconds)
        self._queue_depth_gauge.set(self._batcher.queue_depth)

    def _record_batch(self, record: BatchRecord) -> None:
        self.batches_total += 1
        self._batch_rows.observe(record.rows)
        self._compute_seconds.observe(record.compute_s)
        for q in record.queue_s:
            self._queue_seconds.observe(q)
        self.statistics.batch(record.rows, record.queue_s, record.compute_s)
        self._queue_depth_gauge.set(self._batcher.queue_depth)

    def _batch_stuck(self) -> None:
        """The batcher abandoned an instance whose call ran past the watchdog: replace it, unless
        stuck calls hold too many executor threads already (this model's or the process's)."""
        self._metrics.batch_watchdog.labels(*self._labels).inc()
        if self.state is not ModelState.READY:
            return
        refused = self._watchdog.why_not_replace(self._pool.stuck, self._stuck_calls)
        if refused is not None:
            self._mark_unavailable(refused)
            return
        task = asyncio.create_task(self._replace_stuck(), name=f"replace:{self.name}")
        self._replacing.add(task)
        task.add_done_callback(self._replacing.discard)

    async def _replace_stuck(self) -> None:
        try:
            built = await self._pool.replenish()
        except Exception as exc:
            log.exception("model %s version %d: no replacement instance", self.name, self.version)
            if self._pool.size == 0:
                self._mark_unavailable(f"no runtime instance left: replacement failed: {exc}")
            return
        log.info(
            "model %s version %d: %d replacement instance(s) serving",
            self.name,
            self.version,
            built,
        )

    def _mark_unavailable(self, reason: str) -> None:
        self.state = ModelState.UNAVAILABLE
        self.reason = reason
        self._metrics.model_ready.labels(*self._labels).set(0)
        log.error("model %s version %d is unavailable: %s", self.name, self.version, reason)
        self._batcher.refuse_queued(
            ModelUnavailable(f"model {self.name} version {self.version} is unavailable: {reason}")
        )

    def publish_state(self) -> None:
        """Set the ready gauge from the state (after another host with the same labels set it)."""
        self._metrics.model_ready.labels(*self._labels).set(1 if self.ready else 0)

    def _publish_knobs(self) -> None:
        for knob, value in self._knobs.as_dict().items():
            self._metrics.knob.labels(*self._labels, knob).set(value)

    def _describe(self) -> str:
        return ", ".join(f"{k}={v:g}" for k, v in self._knobs.as_dict().items())


def _carried(configured: Knobs, previous: Knobs, limits: KnobLimits) -> Knobs:
    """The previous version's knobs where they fit this version's limits, else the configured
    ones: a knob that no longer fits is dropped, not an error that would fail the reload."""
    try:
        return limits.check(previous)
    except InvalidKnobs:
        return configured
