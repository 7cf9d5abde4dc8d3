"""The online agent: one decision loop per served model, inside the gateway's event loop.

When it starts, the agent applies ``AgentSettings.start`` (the gateway passes the expert
default, ``rrl.tuners.space.expert_default``): that is the first incumbent, what a practitioner
would configure; knobs an operator set before then are kept instead (``set_by_hand``). The
agent's first duty is to do no harm, so it leaves the incumbent only on a bet it can check.
Each decision interval it

1. feeds the queueing model (``rrl.agent.queueing``) the batch service times the gateway measured
   under the running threads, and describes the arrivals (rate, burstiness, rows);
2. asks the **prediction gate** (``rrl.agent.gate``) whether a candidate's predicted gain over the
   incumbent clears the prediction's uncertainty; candidates are the grid screened by the model,
   plus the tuner's own proposal (adaptive RRL by default, with profile priors), minus those the
   tuner's estimates (prior) put beyond ``explore_regret`` times the incumbent and those that
   already lost a trial in this state;
3. runs a **trial** (``rrl.agent.trial``) for a candidate let through: interleaved or paired windows
   against the incumbent, normalised by the arrival rate each saw; a candidate measured worse
   after its first window is **reverted** at once, one that wins becomes the incumbent;
4. **remembers** per workload state (``rrl.agent.memory``: rate level, size level, burstiness) the
   incumbent, and applies it at once when the state recurs;
5. measures the interval (``interval_s``, at least ``min_requests`` requests, at most
   ``max_interval_s``; requests answered within ``settle_s`` of a change left out), tells the
   tuner and calibrates the model (its residual is the model's proven error);
6. **rests** (``rrl.agent.resting``) when the gate let nothing through at this load and the
   incumbent meets the SLO with margin: no simulation, the interval doubling up to
   ``rest.max_interval_s``, the monitor still ticked every ``tick_s``; a tick whose arrivals do
   not fit the rate it rested at wakes it at once.

Rules kept from before: **drain** (an interval that starts with a backlog and ends with a
shorter queue measured the backlog, not its configuration: not learned, and what drains it keeps
running); **pacing** (a candidate that rebuilds sessions waits until rebuilding takes at most
``rebuild_duty`` of the time, ``min_rebuild_gap_s`` at least, unless the incumbent violates the
SLO); **idle** (too little traffic changes nothing); **paused** (knobs set by hand). Every
decision says what was predicted, what was measured and why (``rrl.agent.decisions``). Nothing here
imports the gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from models.knobs import Knobs
from rrl.agent.budget import CoreBudget
from rrl.agent.control import ModelControl, current_config, measure
from rrl.agent.decisions import Decision, Step
from rrl.agent.gate import needs_rebuild
from rrl.agent.policy import Policy
from rrl.agent.settings import ONLINE_TUNERS, AgentSettings
from rrl.offline.priors import Priors, leave_ctrl_c_to_the_parent
from rrl.tuners.measurement import Measurement
from rrl.tuners.objective import Objective
from rrl.tuners.space import ConfigSpace
from rrl.tuners.workload import MonitorSettings

log = logging.getLogger("rrl.agent")

__all__ = ["ONLINE_TUNERS", "AgentSettings", "Decision", "ModelAgent"]

Listener = Callable[[Decision, "ModelAgent"], None]
MODEL_NICENESS = 10


class ModelAgent:
    """The decision loop of one model: applies what its rule (``policy``, a
    ``rrl.agent.policy.Policy``) chooses, measures it through the control protocol, tells the
    rule what happened, and publishes every decision. ``clock`` and ``sleep`` time the loop (a
    test's controlled ones; the queueing model's simulations take no time on them)."""

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
        budget: CoreBudget | None = None,
        model_pool: Executor | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._clock, self._sleep = clock, sleep
        self.policy = Policy(
            model,
            space=space,
            slo_ms=slo_ms,
            cores=cores,
            settings=settings,
            seed=seed,
            budget=budget,
            on_record=self._recorded,
            clock=clock,
        )
        self.model = model
        self.space = space
        self.settings = self.policy.settings
        self.control = control
        self._model_pool = model_pool
        self.paused = False
        """Knobs set by hand: the agent watches the load and changes nothing."""
        self._set_by_hand = False
        self.prior_states = 0
        self._listener = listener
        self._cpu_clock = cpu_clock
        self._priors = priors
        self._service_fresh = False
        self._last_tick = self._clock()
        self.started = asyncio.Event()
        """Set once the priors are loaded (or not) and the start configuration applied."""
        self._snapshot: dict[str, Any] = self._build_snapshot()

    async def run(self) -> None:
        """Decide, apply, measure, learn; forever (until cancelled). One failing interval is
        logged and the loop goes on: the agent must never take the gateway down with it."""
        policy = self.policy
        # First, before the seconds the priors and the model's process take: knobs an
        # operator sets after this are theirs (``set_by_hand``), not overridden by the start.
        await self._apply_start()
        if self._priors is not None:
            try:
                priors = await asyncio.to_thread(
                    self._priors, policy.objective, self.settings.monitor
                )
                self.prior_states = policy.tuner.set_priors(priors)
            except Exception:  # a broken profile costs the warm start, not the agent
                log.exception("tuner %s: profile priors not loaded", self.model)
        # The queueing model simulates in a process of its own: pure Python in a thread here
        # would hold the interpreter lock the event loop needs to serve.
        pool = self._model_pool or model_process()
        policy.queue_model.executor = pool
        try:
            await self._run(pool)
        finally:
            policy.queue_model.executor = None
            if self._model_pool is None:  # ours: the gateway's shared one is closed by it
                pool.shutdown(wait=False, cancel_futures=True)

    async def _run(self, pool: Executor) -> None:
        # Start the model's process now, not in the first burst.
        await asyncio.get_running_loop().run_in_executor(pool, int)
        self.policy.begin(self._in_effect())
        self._last_tick = self._clock()
        self._snapshot = self._build_snapshot()
        self.started.set()
        while True:
            try:
                await self._interval()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("tuner %s: interval failed; retrying", self.model)
                await self._sleep(self.settings.max_interval_s)

    def _in_effect(self) -> Knobs:
        return current_config(self.control, self.model, self.space)

    def set_by_hand(self) -> None:
        """An operator set the model's knobs: the agent pauses, and a start configuration it
        has not applied yet never is. An agent applied its start only after loading its priors
        and starting the model's process, seconds in which knobs set by hand and the agent
        resumed were replaced by the start (every poor start of ``iotgw bench find``)."""
        self.paused = True
        self._set_by_hand = True

    async def _apply_start(self) -> None:
        start = self.settings.start
        if start is None:
            return
        if self._set_by_hand:
            log.info("tuner %s: knobs set by hand before it started: kept", self.model)
            return
        try:
            await self.control.set_knobs(self.model, None, self.space.snap(start))
        except Exception:  # the configured knobs keep serving: worse, not broken
            log.exception("tuner %s: start configuration %s not applied", self.model, start)

    async def _interval(self) -> None:
        s, policy = self.settings, self.policy
        if self.paused or policy.workload is None:
            await self._watch(s.interval_s)
            return
        rate = policy.monitor.rate_per_s
        if rate * s.max_interval_s < s.min_requests:
            policy.idle(f"{rate:.2f} requests/s")
            await self._watch(s.interval_s)
            return
        policy.busy()
        # Knobs may have been set by hand while paused: start from what is in effect.
        policy.in_effect(self._in_effect())
        self._read_service_times()
        # Resting simulates nothing, so it is decided here; choosing otherwise may simulate
        # (in the model's process, waited for in a thread), so the queue is read here, on the
        # loop, and the rule runs in a thread.
        step = policy.rest_step()
        if step is None:
            step = await asyncio.to_thread(policy.choose, self._queue_depth())
        rebuilt = False
        if step.config != policy.current:
            try:
                rebuilt, applied = await self._apply(step.config)
                step = replace(step, config=applied)
            except Exception as exc:  # a configuration the gateway cannot build
                policy.failed(step, str(exc), self._in_effect())
                return
        await self._measure_interval(step, rebuilt)

    async def _measure_interval(self, step: Step, rebuilt: bool) -> None:
        s, policy = self.settings, self.policy
        applied_at = self._clock()
        cpu_start = self._cpu_clock()
        queued_at_start = self._queue_depth()
        measurement, event = await self._collect(applied_at)
        self._service_fresh = not rebuilt
        if event is not None:  # the interval straddles a step: not learned
            policy.not_measured(step, event)
            if event == "state":
                policy.workload_changed(step.config, rebuilt)
            return
        if measurement is None:
            policy.idle(f"fewer than {s.min_requests} requests in {s.max_interval_s:g}s")
            return
        if policy.objective.name == "cost":
            cpu = (self._cpu_clock() - cpu_start) / max(self._clock() - applied_at, 1e-9)
            measurement = replace(measurement, cpu_cores=cpu)
        queued = (queued_at_start, self._queue_depth())
        # In a thread, as choosing is: a trial's window is normalised by the model's
        # predictions, which may have to be simulated (in the model's process, waited for).
        await asyncio.to_thread(policy.learn, step, measurement, rebuilt, queued=queued)

    def _read_service_times(self) -> None:
        """The gateway's recent batch times, credited to the threads that ran them: only after
        an interval without a rebuild (right after one, the gateway's recent batches are still
        the previous sessions')."""
        current, queue_model = self.policy.current, self.policy.queue_model
        assert current is not None
        samples = self.control.service_samples(self.model)
        if samples and (self._service_fresh or not queue_model.measured_settings()):
            queue_model.observe_service((current.concurrency, current.intra_op_threads), samples)
        per_batch_s = queue_model.settings.per_batch_s
        if (per_request_s := self.control.front_end_s(per_batch_s)) is not None:
            queue_model.observe_front_end(per_request_s)

    async def _collect(self, applied_at: float) -> tuple[Measurement | None, str | None]:
        """Wait out one interval (longer while resting); (measurement or None when too few
        requests, "state" when the workload state changed meanwhile, "wake" when a resting
        agent saw the load move)."""
        s, policy = self.settings, self.policy
        interval = policy.rest.interval_s()
        while True:
            if event := await self._tick():
                return None, event
            elapsed = self._clock() - applied_at
            window = elapsed - s.settle_s
            if elapsed >= interval and window > 0:
                m = measure(self.control, self.model, window)
                if m.offered >= policy.load_kind.window_requests(s.min_requests):
                    return m, None
            if elapsed >= max(s.max_interval_s, interval):
                return None, None
            await self._sleep(s.tick_s)

    async def _watch(self, seconds: float) -> None:
        end = self._clock() + seconds
        while self._clock() < end:
            await self._sleep(self.settings.tick_s)
            # What is in effect: knobs may have been set by hand since the rule last applied.
            if await self._tick() == "state" and self.policy.current is not None:
                self.policy.workload_changed(self._in_effect(), False)

    async def _tick(self) -> str | None:
        """Feed the rule the arrivals since the last tick; "state" if the workload state
        changed, "wake" if a resting agent woke (``rrl.agent.resting``)."""
        now = self._clock()
        span = now - self._last_tick
        if span < self.settings.tick_s * 0.5:
            return None
        self._last_tick = now
        return self.policy.tick(now, self.control.stats(self.model, window_s=span), span)

    def _queue_depth(self) -> int:
        return int(self.control.stats(self.model, window_s=0.0).queue_depth)

    async def _apply(self, config: Knobs) -> tuple[bool, Knobs]:
        current = self.policy.current
        assert current is not None
        rebuild = needs_rebuild(current, config)
        started = self._clock()
        applied = self.space.snap(await self.control.set_knobs(self.model, None, config))
        self.policy.applied(applied, (started, self._clock()) if rebuild else None)
        return rebuild, applied

    def snapshot(self, *, decisions: int = 20, estimates: int = 10) -> dict[str, Any]:
        """The agent's state for the HTTP endpoint (built after each decision, so reading it
        never races the model working in its thread)."""
        snap = dict(self._snapshot)
        snap["decisions"] = [d.as_dict() for d in list(self.policy.history)[-decisions:]]
        snap["estimates"] = snap.get("estimates", [])[:estimates]
        return snap

    def _evidence(self) -> dict[str, Any]:
        """Whether the model's "no" stands, and what kind of load it is judged against."""
        policy = self.policy
        miss = policy.trust.last_miss()
        closed = policy.load_kind.closed
        return {
            "model_trusted": policy.trust.trusted,
            "last_miss": None if miss is None else miss.describe(),
            "load": "closed-loop" if closed else "open-loop",
            "population": policy.load_kind.population if closed else None,
            "measured_configurations": policy.tuner.estimate_counts()[0],
        }

    def _build_snapshot(self) -> dict[str, Any]:
        p = self.policy
        best = p.incumbent or p.tuner.recommend()
        trial, rest, queue_model = p.trial, p.rest.state, p.queue_model
        return {
            "model": self.model,
            "algorithm": self.settings.algorithm,
            "objective": p.objective.name,
            "slo_ms": p.objective.slo_ms,
            "paused": self.paused,
            "workload": None
            if p.workload is None
            else {
                "state": str(p.workload),
                "rate_level": p.workload.rate_level,
                "size_level": p.workload.size_level,
                "dispersion": round(p.dispersion(), 3),
            },
            "rate_per_s": round(p.monitor.rate_per_s, 3),
            "current": None if p.current is None else p.current.as_dict(),
            "best": best.as_dict(),
            "best_estimate": p.tuner.predict(best),
            "trial": None
            if trial is None
            else {
                "candidate": trial.candidate.as_dict(),
                "windows": len(trial.windows),
                "of": len(trial.schedule()),
            },
            "gate": None if p.verdict is None else p.verdict.as_dict(),
            "queue_model": {
                "offset_ms": round(queue_model.offset_ms(), 3),
                "error_ms": round(queue_model.error_ms(), 3),
                "measured_threads": [f"{c}x{t}" for c, t in queue_model.measured_settings()],
                "loop_ms_per_request": round(queue_model.per_request_s * 1e3, 4),
                "simulations": queue_model.simulations,
                "cache_hits": queue_model.cache_hits,
            },
            "evidence": self._evidence(),
            "rest": None
            if rest is None
            else {
                "since_s": round(self._clock() - rest.since, 1),
                "rate_per_s": round(rest.rate_per_s, 2),
                "interval_s": rest.interval_s,
            },
            "memory": p.memory.as_dict(),
            "core_budget": None if p.budget is None else p.budget.as_dict(),
            "tuner": p.tuner.snapshot(),
            "decision_counts": dict(p.counts),
            "prior_states": self.prior_states,
            "last_rebuild_s": round(p.last_rebuild_s, 4),
            "estimates": [
                {"config": c.as_dict(), "objective": round(v, 4), "measured": n}
                for c, v, n in p.tuner.estimates(limit=50)
            ],
        }

    def _recorded(self, decision: Decision) -> None:
        if self._listener is not None:
            self._listener(decision, self)
        self._snapshot = self._build_snapshot()


def model_process() -> ProcessPoolExecutor:
    """A process for the queueing model's simulations (``QueueModel.executor``); several agents
    may share one (the gateway's do)."""
    spawn = multiprocessing.get_context("spawn")  # no fork of a process running sessions
    return ProcessPoolExecutor(max_workers=1, mp_context=spawn, initializer=_model_worker_start)


def _model_worker_start() -> None:
    leave_ctrl_c_to_the_parent()  # Ctrl-C is the gateway's to handle: it shuts the pool down
    lowest_priority()


def lowest_priority() -> None:
    """Run this process only on CPU nobody else wants: ``SCHED_IDLE`` (and nice), on all its
    threads; threads started later inherit it.

    A gate is asked as a burst begins, which is when a small machine has no CPU to spare; nice
    alone still let the simulations take a core then (rrl/README.md, "The prediction" has the
    measurement), while an idle-policy task gives way at once to any other that wakes. Nice
    applies per thread on Linux, and the spawned process's imports (it imports the parent's
    main module) start a thread before this runs. Where the platform has no such policy, or
    refuses it, the nice value is what is left."""
    tasks = Path("/proc/self/task")
    tids = [int(t.name) for t in tasks.iterdir()] if tasks.is_dir() else [0]
    for tid in tids:
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.setpriority(os.PRIO_PROCESS, tid, MODEL_NICENESS)
        if hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_IDLE"):
            with contextlib.suppress(OSError):
                os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
