"""The online agent: one decision loop per served model, inside the gateway's event loop.

When it starts, the agent applies ``AgentSettings.start`` (the gateway passes the expert
default, ``rrl.space.expert_default``), so tuning begins from what a practitioner would
configure. Then each decision interval the agent

1. picks a configuration: the tuner's proposal, unless the safety rules below say otherwise;
2. applies it through the control interface (``rrl.control``; request-level knobs take effect
   at the next batch, thread and concurrency changes rebuild runtime sessions first);
3. waits until the interval has lasted ``interval_s`` and held ``min_requests`` requests (at
   most ``max_interval_s``), ticking the workload monitor every ``tick_s``;
4. turns the gateway's window snapshot of that interval (minus ``settle_s`` after the change)
   into a measurement and tells the tuner what ran and what it gave.

Safety and pacing, the rules between the tuner and the gateway:

- **veto**: a proposal the tuner's own estimates (region estimate, warm-start prior, or the GP's
  optimistic bound for BO) say will break the SLO badly, i.e. score worse than ``p95 = SLO with
  unsafe_violation_fraction of the requests violating``, or cost more than ``explore_regret``
  times the best known configuration's estimate, is not run; the tuner is asked never to
  explore it, and the best known configuration runs instead;
- **back off**: a configuration that was run and measured that badly (beyond the safety limit,
  or more than ``explore_regret`` times the best known configuration's estimate: what a veto
  would have refused had the estimate known) is left at once, rebuild pace or not: the next
  interval runs the best known configuration (and exploration resumes after it);
- **pacing**: a change of threads or concurrency rebuilds sessions, which costs CPU and a latency
  blip; rebuilds are spaced at least ``min_rebuild_gap_s`` apart and so that rebuilding takes at
  most ``rebuild_duty`` of the time (the last rebuild's duration / duty), except for the first
  configuration of a new workload state and to leave a configuration that violates the SLO
  (``violating_fraction``) for one expected to meet it. A proposal that needs a
  rebuild too soon waits: meanwhile the best configuration measured in this state among those
  that keep the current threads and concurrency runs (request-level knobs only, no rebuild), or
  the current one again when none measured is better (a replicate, which the tuner uses to
  estimate noise);
- **drain**: an interval that starts with a backlog in the queue (a state change served by the
  previous state's configuration, an exploration that could not keep up) and ends with a
  shorter one measured the backlog draining, not its configuration: it is not learned (it
  would make whatever drains it look as bad as what left it), and the configuration draining
  it keeps running until the backlog is gone. A backlog that does not shrink is measured as
  usual: it is what that configuration is worth under this load;
- **idle**: an interval without ``min_requests`` requests teaches nothing and changes nothing;
  an interval in which the workload state changed is discarded (it mixes two workloads), and
  the tuner switches to the new state's table (warm-started from the profile's prior for that
  state when the gateway has a matching profile, ``rrl.priors``, else from the nearest known
  state's table).

Every decision is logged, kept in a bounded history, and passed to a listener (the gateway turns
them into Prometheus metrics). Nothing here imports the gateway.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rrl.ask_tell import PerWorkload, TuningProblem
from rrl.control import ModelControl, apply_config, current_config, measure
from rrl.measurement import Measurement
from rrl.objective import Objective, make_objective
from rrl.priors import Priors
from rrl.space import Config, ConfigSpace
from rrl.workload import MonitorSettings, WorkloadMonitor, WorkloadState

log = logging.getLogger("rrl.online")

ONLINE_TUNERS = ("rrl", "adaptive-rrl", "bo", "hill-climb", "aimd", "inflight", "static")


@dataclass(frozen=True)
class AgentSettings:
    algorithm: str = "adaptive-rrl"
    objective: str = "latency"
    interval_s: float = 0.5
    """Shortest decision interval. With ``min_requests`` it makes the interval adapt to the
    load: at 256 requests/s a decision every 0.5 s, at 16/s one every 2.5 s, so a burst is
    explored (and left) as many times faster as it brings requests."""
    max_interval_s: float = 10.0
    """Longest wait for ``min_requests`` before an interval counts as idle."""
    min_requests: int = 40
    """Requests an interval must hold to be a measurement."""
    tick_s: float = 0.5
    """How often the workload monitor is updated."""
    settle_s: float = 0.2
    """Requests answered this soon after a change are left out of its measurement (they were
    mostly queued under the previous configuration)."""
    min_rebuild_gap_s: float = 1.0
    rebuild_duty: float = 0.1
    unsafe_violation_fraction: float = 0.5
    violating_fraction: float = 0.1
    """A configuration measured worse than p95 at the SLO with this fraction violating is left
    for one expected to meet the SLO without waiting for the rebuild pace."""
    explore_regret: float = 2.0
    """A proposal expected to score more than this many times the best known configuration's
    estimate is not explored (bounds what exploration may cost the devices)."""
    backlog_s: float = 0.25
    min_backlog: int = 8
    """A queue holding more than ``backlog_s`` seconds of arrivals (and at least
    ``min_backlog`` requests) when an interval starts is a backlog: left by a state change or
    by an exploration. An interval that starts with one and ends with a shorter queue measured
    the backlog draining, not its configuration: it is not learned, and that configuration
    keeps running until the backlog is gone (see the module docstring)."""
    history: int = 200
    """Decisions kept for the HTTP endpoint."""
    start: Config | None = None
    """The configuration applied when the agent starts (the gateway passes the expert default,
    ``rrl.space.expert_default``: the agent then never starts worse than what a practitioner
    would configure); None keeps the knobs the gateway has."""
    monitor: MonitorSettings = field(default_factory=MonitorSettings)


@dataclass(frozen=True, slots=True)
class Decision:
    """One interval: what ran, why, and what it gave (``objective`` None: not measured)."""

    at: float  # wall clock (time.time())
    model: str
    kind: str  # explore | exploit | backoff | veto | hold | drain | idle | workload | failed
    config: Config
    workload: WorkloadState | None
    reason: str = ""
    objective: float | None = None
    measurement: Measurement | None = None
    rebuilt: bool = False

    def as_dict(self) -> dict[str, Any]:
        m = self.measurement
        return {
            "at": round(self.at, 3),
            "kind": self.kind,
            "config": self.config.knob_changes(),
            "workload": None if self.workload is None else str(self.workload),
            "reason": self.reason,
            "objective": self.objective,
            "rebuilt": self.rebuilt,
            "measurement": None
            if m is None
            else {
                "duration_s": round(m.duration_s, 3),
                "offered": m.offered,
                "completed": m.completed,
                "p50_ms": round(m.p50_ms, 3),
                "p95_ms": round(m.p95_ms, 3),
                "p99_ms": round(m.p99_ms, 3),
                "slo_violations": m.slo_violations,
            },
        }


Listener = Callable[[Decision, "ModelAgent"], None]


class ModelAgent:
    """The decision loop of one model (see the module docstring)."""

    def __init__(
        self,
        control: ModelControl,
        model: str,
        *,
        space: ConfigSpace,
        slo_ms: float,
        cores: int,
        settings: AgentSettings | None = None,
        seed: int = 0,
        listener: Listener | None = None,
        cpu_clock: Callable[[], float] = time.process_time,
        priors: Callable[[Objective, MonitorSettings], Priors] | None = None,
    ) -> None:
        self.control = control
        self.model = model
        self.settings = s = settings or AgentSettings()
        if s.algorithm not in ONLINE_TUNERS:
            raise ValueError(f"unknown online tuner {s.algorithm!r}; known: {ONLINE_TUNERS}")
        self.space = space
        self.objective = make_objective(s.objective, slo_ms=slo_ms, cores=cores)
        # Deferred: the GP tuners import scikit-learn (iotgw[tune]), which the gateway only
        # needs once it starts an agent.
        from rrl.registry import build_tuner

        self.tuner: PerWorkload = build_tuner(
            s.algorithm, TuningProblem(space, self.objective, cores=cores, seed=seed)
        )
        self.monitor = WorkloadMonitor(s.monitor)
        self.history: deque[Decision] = deque(maxlen=s.history)
        self.counts: dict[str, int] = {}
        self.current: Config | None = None
        self.workload: WorkloadState | None = None
        self.last_rebuild_end = -float("inf")
        self.last_rebuild_s = 0.0
        self.paused = False
        self._listener = listener
        self._cpu_clock = cpu_clock
        self._backoff = False
        self._backoff_reason = ""
        self._last_measured: tuple[Config, float] | None = None
        self._fresh_state = False  # no measurement yet in the current workload state
        self._draining = False  # the last interval drained a backlog (and was not learned)
        self._idle = False
        self._last_tick = time.monotonic()
        self._priors = priors
        self.prior_states = 0
        self._snapshot: dict[str, Any] = self._build_snapshot()

    # -- the loop ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Decide, apply, measure, learn; forever (until cancelled). One failing interval is
        logged and the loop goes on: the agent must never take the gateway down with it."""
        if self._priors is not None:
            try:
                priors = await asyncio.to_thread(
                    self._priors, self.objective, self.settings.monitor
                )
                self.prior_states = self.tuner.set_priors(priors)
            except Exception:  # a broken profile costs the warm start, not the agent
                log.exception("tuner %s: profile priors not loaded", self.model)
        await self._apply_start()
        self.current = current_config(self.control, self.model, self.space)
        self._last_tick = time.monotonic()
        self._snapshot = self._build_snapshot()
        while True:
            try:
                await self._interval()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("tuner %s: interval failed; retrying", self.model)
                await asyncio.sleep(self.settings.max_interval_s)

    async def _apply_start(self) -> None:
        start = self.settings.start
        if start is None:
            return
        try:
            await apply_config(self.control, self.model, self.space.snap(start))
        except Exception:  # the configured knobs keep serving: worse, not broken
            log.exception("tuner %s: start configuration %s not applied", self.model, start)

    async def _interval(self) -> None:
        s = self.settings
        if self.paused or self.workload is None:
            # Nothing to decide before the workload is known: watch the traffic only.
            await self._watch(s.interval_s)
            return
        if self.monitor.rate_per_s * s.max_interval_s < s.min_requests:
            # Too little traffic to measure anything: leave the knobs as they are.
            self._set_idle(f"{self.monitor.rate_per_s:.2f} requests/s")
            await self._watch(s.interval_s)
            return
        self._idle = False
        # Knobs may have been set by hand while paused: start from what is in effect.
        self.current = current_config(self.control, self.model, self.space)
        # The queue is read here, on the loop: choose runs in a thread.
        config, kind, reason = await asyncio.to_thread(self.choose, self._queue_depth())
        rebuilt = False
        if config != self.current:
            try:
                rebuilt, config = await self._apply(config)
            except Exception as exc:  # a configuration the gateway cannot build
                self.tuner.exclude(config)
                self._record(
                    Decision(
                        time.time(), self.model, "failed", config, self.workload, reason=str(exc)
                    )
                )
                self.current = current_config(self.control, self.model, self.space)
                return
        applied_at = time.monotonic()
        cpu_start = self._cpu_clock()
        queued_at_start = self._queue_depth()
        measurement, state_changed = await self._collect(applied_at)
        if state_changed:
            self._record(
                Decision(
                    time.time(),
                    self.model,
                    "workload",
                    config,
                    self.workload,
                    reason=f"rate {self._change_rate():.1f}/s",
                    rebuilt=rebuilt,
                )
            )
            self._enter_state()
            return
        if measurement is None:
            self._set_idle(f"fewer than {s.min_requests} requests in {s.max_interval_s:g}s")
            return
        queued = (queued_at_start, self._queue_depth())
        if self.objective.name == "cost":
            cpu = (self._cpu_clock() - cpu_start) / max(time.monotonic() - applied_at, 1e-9)
            measurement = _with_cpu(measurement, cpu)
        self.learn(config, measurement, kind, reason, rebuilt, queued=queued)

    def _set_idle(self, reason: str) -> None:
        """Record one 'idle' decision when the model goes quiet (not one per interval)."""
        if not self._idle and self.current is not None:
            self._idle = True
            self._record(
                Decision(time.time(), self.model, "idle", self.current, self.workload, reason)
            )

    def learn(
        self,
        config: Config,
        measurement: Measurement,
        kind: str,
        reason: str,
        rebuilt: bool,
        *,
        queued: tuple[int, int] = (0, 0),
    ) -> Decision:
        """Tell the tuner what ran and what it gave; arm the back-off if it was that bad. An
        interval that drained a backlog (``queued``: the queue depth at its start and end) is
        recorded but not learned (the drain rule). Runs on the event loop (an observation is
        cheap), so the history and the snapshot are only ever changed there."""
        start, end = queued
        self._draining = self._is_backlog(start) and end < start
        if self._draining:
            decision = Decision(
                time.time(),
                self.model,
                "drain",
                config,
                self.workload,
                reason=f"{kind}: queue {start} -> {end} requests, measured the backlog "
                "draining (not learned)",
                measurement=measurement,
                rebuilt=rebuilt,
            )
            self._record(decision)
            return decision
        value = self.objective(config, measurement)
        self._last_measured = (config, value)
        self._fresh_state = False
        self.tuner.observe(config, measurement)
        best = self.tuner.recommend()
        unsafe = value > self._unsafe_value(config)
        # Measured beyond what a veto refuses (explore_regret x the best): staying to wait for
        # the rebuild pace would cost every request of the wait; leaving costs one rebuild.
        regret = value > self._explore_limit(best)
        self._backoff = (unsafe or regret) and config != best
        self._backoff_reason = (
            "previous configuration broke the SLO badly"
            if unsafe
            else f"previous configuration measured over {self.settings.explore_regret:g}x the best"
        )
        if self._backoff:
            limit = "the safety limit" if unsafe else "the exploration limit"
            reason = (reason + "; " if reason else "") + f"measured beyond {limit}"
        decision = Decision(
            time.time(),
            self.model,
            kind,
            config,
            self.workload,
            reason=reason,
            objective=value,
            measurement=measurement,
            rebuilt=rebuilt,
        )
        self._record(decision)
        return decision

    def choose(self, queued: int = 0) -> tuple[Config, str, str]:
        """The next configuration and why, with ``queued`` requests waiting now (runs in a
        worker thread: BO fits a GP)."""
        assert self.current is not None
        if self._draining and self._is_backlog(queued):
            # The running configuration is draining a backlog: let it; what runs meanwhile
            # could not be measured anyway, and a change (a rebuild above all) slows the drain.
            return self.current, "drain", f"backlog of {queued} requests draining"
        best = self.tuner.recommend()
        if self._backoff:
            return best, "backoff", self._backoff_reason
        proposal = self.tuner.propose()
        kind = "exploit" if proposal == best else "explore"
        predicted = self.tuner.predict(proposal)
        if proposal != best and predicted is not None and predicted > self._explore_limit(best):
            self.tuner.exclude(proposal)
            return best, "veto", f"{proposal} expected to score {predicted:.1f}"
        # Not paced: the first configuration of a new workload state (the start the tuner
        # chose for it, e.g. the profile's best), and leaving a configuration that violates
        # the SLO for one expected to meet it: waiting costs the devices more than a rebuild.
        urgent = self._fresh_state or (
            self._current_violates()
            and predicted is not None
            and predicted <= self._slo_value(proposal, 0.0)
        )
        if _needs_rebuild(self.current, proposal) and not urgent and not self._rebuild_allowed():
            wait = self._next_rebuild_at() - time.monotonic()
            meanwhile = self._best_without_rebuild()
            return meanwhile, "hold", f"{proposal} waits {wait:.1f}s for the rebuild pace"
        return proposal, kind, ""

    def _queue_depth(self) -> int:
        return int(self.control.stats(self.model, window_s=0.0).queue_depth)

    def _is_backlog(self, queued: int) -> bool:
        """Whether ``queued`` requests are a backlog at the current arrival rate."""
        s = self.settings
        return queued >= max(s.min_backlog, self.monitor.rate_per_s * s.backlog_s)

    def _current_violates(self) -> bool:
        """Whether the configuration running now was last measured worse than p95 at the SLO
        with ``violating_fraction`` of the requests violating."""
        last = self._last_measured
        return (
            last is not None
            and last[0] == self.current
            and last[1] > self._slo_value(last[0], self.settings.violating_fraction)
        )

    def _explore_limit(self, best: Config) -> float:
        """The worst expected score a proposal may have to be run: the safety limit, and at most
        ``explore_regret`` times what the best known configuration is expected to score."""
        limit = self._unsafe_value(best)
        best_value = self.tuner.predict(best)
        if best_value is not None and best_value > 0:
            limit = min(limit, self.settings.explore_regret * best_value)
        return limit

    def _best_without_rebuild(self) -> Config:
        """Among the configurations with the current threads and concurrency (request-level
        knobs only, so no rebuild), the best one measured in this state: a wait is spent on
        what is known to work, not on a guess; the current one when none measured beats it."""
        assert self.current is not None
        current = self.current
        best = next(
            (
                (value, config)
                for config, value, times in self.tuner.estimates()  # best first
                if times > 0 and not _needs_rebuild(current, config)
            ),
            None,
        )
        if best is None:
            return current
        value, config = best
        now = self.tuner.predict(current)
        return config if now is None or value < now else current

    async def _apply(self, config: Config) -> tuple[bool, Config]:
        assert self.current is not None
        rebuild = _needs_rebuild(self.current, config)
        started = time.monotonic()
        applied = self.space.snap(await apply_config(self.control, self.model, config))
        if rebuild:
            self.last_rebuild_end = time.monotonic()
            self.last_rebuild_s = self.last_rebuild_end - started
        self.current = applied
        return rebuild, applied

    async def _collect(self, applied_at: float) -> tuple[Measurement | None, bool]:
        """Wait out one interval; (measurement or None when too few requests, whether the
        workload state changed meanwhile)."""
        s = self.settings
        while True:
            if await self._tick():
                return None, True
            elapsed = time.monotonic() - applied_at
            window = elapsed - s.settle_s
            if elapsed >= s.interval_s and window > 0:
                m = measure(self.control, self.model, window)
                if m.offered >= s.min_requests:
                    return m, False
            if elapsed >= s.max_interval_s:
                return None, False
            await asyncio.sleep(s.tick_s)

    async def _watch(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            await asyncio.sleep(self.settings.tick_s)
            if await self._tick():
                self._record(
                    Decision(
                        time.time(),
                        self.model,
                        "workload",
                        self.current,  # type: ignore[arg-type]
                        self.workload,
                        reason=f"rate {self._change_rate():.1f}/s",
                    )
                )
                self._enter_state()

    def _change_rate(self) -> float:
        """The rate the monitor judged the new state from (not the window's, which straddles
        the step)."""
        changes = self.monitor.changes
        return changes[-1].rate_per_s if changes else self.monitor.rate_per_s

    def _enter_state(self) -> None:
        """The tuner moves to the new workload state's table; its first configuration there is
        not paced (see ``choose``)."""
        self.tuner.set_workload(self.workload)  # type: ignore[arg-type]
        self._fresh_state = True
        # The new state's first configuration runs whatever the last one left: a backlog is
        # drained by it, not by the previous state's configuration.
        self._backoff = False
        self._draining = False

    async def _tick(self) -> bool:
        """Feed the monitor the arrivals since the last tick; True if the state changed."""
        now = time.monotonic()
        span = now - self._last_tick
        if span < self.settings.tick_s * 0.5:
            return False
        self._last_tick = now
        stats = self.control.stats(self.model, window_s=span)
        # Arrivals, not completions: while a queue builds (a step up, served by a configuration
        # that cannot keep up) completions read a burst as a fraction of itself, and the state
        # would first be judged a level or more short.
        state = self.monitor.update(now, stats.arrived, stats.arrived_rows)
        known = self.monitor.state is not None
        if known and state != self.workload:
            self.workload = state
            return True
        return False

    # -- rules -------------------------------------------------------------------------------

    def _unsafe_value(self, config: Config) -> float:
        """The objective of 'p95 at the SLO with ``unsafe_violation_fraction`` violating'."""
        return self._slo_value(config, self.settings.unsafe_violation_fraction)

    def _slo_value(self, config: Config, v: float) -> float:
        """The objective of 'p95 at the SLO with a fraction ``v`` of the requests violating'."""
        slo = self.objective.slo_ms
        probe = Measurement(
            duration_s=1.0,
            offered=1000,
            completed=1000,
            p50_ms=slo,
            p95_ms=slo,
            p99_ms=slo,
            slo_violations=round(1000 * v),
            rejected=0,
        )
        return self.objective(config, probe)

    def _rebuild_allowed(self) -> bool:
        return time.monotonic() >= self._next_rebuild_at()

    def _next_rebuild_at(self) -> float:
        s = self.settings
        gap = max(s.min_rebuild_gap_s, self.last_rebuild_s / s.rebuild_duty)
        return self.last_rebuild_end + gap

    # -- state -------------------------------------------------------------------------------

    def _record(self, decision: Decision) -> None:
        self.history.append(decision)
        self.counts[decision.kind] = self.counts.get(decision.kind, 0) + 1
        objective = "" if decision.objective is None else f" J={decision.objective:.2f}"
        m = decision.measurement
        seen = "" if m is None else f" p95={m.p95_ms:.1f}ms n={m.offered} viol={m.slo_violations}"
        log.info(
            "tuner %s [%s] %s: %s%s%s%s",
            self.model,
            decision.workload,
            decision.kind,
            decision.config,
            objective,
            seen,
            f" ({decision.reason})" if decision.reason else "",
        )
        if self._listener is not None:
            self._listener(decision, self)
        self._snapshot = self._build_snapshot()

    def snapshot(self, *, decisions: int = 20, estimates: int = 10) -> dict[str, Any]:
        """The agent's state for the HTTP endpoint (built after each decision, so reading it
        never races the tuner working in its thread)."""
        snap = dict(self._snapshot)
        snap["decisions"] = [d.as_dict() for d in list(self.history)[-decisions:]]
        snap["estimates"] = snap.get("estimates", [])[:estimates]
        return snap

    def _build_snapshot(self) -> dict[str, Any]:
        best = self.tuner.recommend()
        return {
            "model": self.model,
            "algorithm": self.settings.algorithm,
            "objective": self.objective.name,
            "slo_ms": self.objective.slo_ms,
            "paused": self.paused,
            "workload": None
            if self.workload is None
            else {
                "state": str(self.workload),
                "rate_level": self.workload.rate_level,
                "size_level": self.workload.size_level,
            },
            "rate_per_s": round(self.monitor.rate_per_s, 3),
            "current": None if self.current is None else self.current.knob_changes(),
            "best": best.knob_changes(),
            "best_estimate": self.tuner.predict(best),
            "tuner": self.tuner.snapshot(),
            "decision_counts": dict(self.counts),
            "prior_states": self.prior_states,
            "last_rebuild_s": round(self.last_rebuild_s, 4),
            "estimates": [
                {"config": c.knob_changes(), "objective": round(v, 4), "measured": n}
                for c, v, n in self.tuner.estimates()[:50]
            ],
        }


def _needs_rebuild(old: Config, new: Config) -> bool:
    return (old.concurrency, old.intra_op_threads, old.inter_op_threads) != (
        new.concurrency,
        new.intra_op_threads,
        new.inter_op_threads,
    )


def _with_cpu(m: Measurement, cpu_cores: float) -> Measurement:
    from dataclasses import replace

    return replace(m, cpu_cores=cpu_cores)
