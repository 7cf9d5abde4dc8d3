"""The online agent's decision rule, top to bottom: what runs next (``choose``), what a measured
interval teaches (``learn``), when to rest and what wakes it. No I/O here:
``rrl.agent.model_agent.ModelAgent`` owns one ``Policy``, applies what it chooses, measures it and
tells it what happened through the methods under "What the loop tells the rule"; the rule's
state (the incumbent, the trial, the workload state, the pacing) is its own and changes only
here.

- **Prediction gate** (``rrl.agent.gate``): a candidate is tried only when the queueing model
  (``rrl.agent.queueing``), fed with the service times the gateway measured per batch size and the
  arrivals it sees, predicts a gain over the incumbent beyond the prediction's uncertainty.
  Candidates: the grid screened by the model, and the tuner's own proposal (adaptive RRL by
  default, with profile priors); the tuner's estimates veto any it puts beyond
  ``explore_regret`` times the incumbent, and a candidate that lost a trial in a workload state
  is not tried there again. At most one trial per ``trial_gap`` incumbent windows, unless the
  incumbent violates the SLO.
- **Measured search** (``rrl.agent.evidence``): when the gate lets nothing through, the agent still
  measures the incumbent's neighbours (one notch on each axis, and the corners: the largest
  batch with every core in one instance's threads, or in single-thread instances) before it
  rests; it rests only on measurement: once each lost a measured trial in this state, or
  once ``search_patience`` trials running lost (one more at each recheck); a trial whose
  candidate led by half its margin is no loss, and one notch beyond it is measured next,
  whatever a model predicts for it. Which neighbour next otherwise:
  in a closed loop (the most requests inside at once the same N tick after tick), a
  simulation of the loop (``QueueModel.closed_loop_ms``), which also puts the grid's best
  predicted first; once the model's predictions of the incumbent missed beyond their stated
  uncertainty in two of three windows, the tuner's region estimates (from measurements; the
  model no longer vetoes); otherwise the model's optimistic prediction, which still vetoes a
  neighbour it predicts to violate the SLO. In a closed loop the gate's candidates are not
  tried (it predicts an open loop), and the closed-loop simulation vetoes only within the
  error it has shown on three or more measured configurations
  (``rrl.agent.evidence.ClosedLoopBand``).
- **Fair comparison and revert** (``rrl.agent.trial``): candidate and incumbent in interleaved
  windows (a thread or instance change too: the gateway parks the sessions a switch leaves, so
  the switch back reuses them), each normalised to a common arrival rate by the model; a
  candidate worse after its first window (or beyond the safety limit while the incumbent's
  windows are within it) is reverted at once.
- **Per-state memory** (``rrl.agent.memory``): the incumbent per (rate level, size level,
  burstiness), applied at once when the state recurs.
- **Pacing**: a candidate that rebuilds sessions waits until rebuilding takes at most
  ``rebuild_duty`` of the time (``min_rebuild_gap_s`` at least), unless the incumbent violates
  the SLO.
- **No harm stays**: an incumbent measured violating the SLO in ``fallback_windows`` windows
  running goes back to the configuration best measured within it in this state (the median of
  its last windows, ``rrl.agent.memory``), whatever trial it lost on the way.
- **Drain**: an interval that started with a backlog and ended with a shorter queue measured
  the backlog draining, not its configuration: not learned, and what drains it keeps running.
- **Rest** (``rrl.agent.resting``): nothing simulated, the interval backing off, while nothing
  moves, once the gate and the measured search found nothing left to try.

Every decision records what the model predicted, what was measured, and why
(``rrl.agent.decisions``).
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

from models.knobs import Knobs
from models.window_stats import WindowStats
from rrl.agent.budget import CoreBudget, threads_of
from rrl.agent.decisions import Decision, Step, log_line
from rrl.agent.evidence import (
    ClosedLoopBand,
    LoadKind,
    ModelTrust,
    beyond,
    neighbours,
)
from rrl.agent.gate import Verdict, decide, needs_rebuild, screen
from rrl.agent.memory import StateKey, StateMemory
from rrl.agent.queueing import OVERLOADED, Arrivals, Prediction, QueueModel
from rrl.agent.resting import Rest
from rrl.agent.settings import ONLINE_TUNERS, AgentSettings
from rrl.agent.trial import BASELINE_WINDOWS, Outcome, PairSpread, Trial, Window, relative_noise
from rrl.tuners.ask_tell import PerWorkload, TuningProblem
from rrl.tuners.measurement import Measurement
from rrl.tuners.objective import at_slo, make_objective
from rrl.tuners.space import ConfigSpace
from rrl.tuners.workload import WorkloadMonitor, WorkloadState, index_of_dispersion

log = logging.getLogger("rrl.agent")

# Closed-loop predictions this close are the same: configurations that form the same batches
# at the same times differ by rounding only.
SAME_PREDICTION = 0.01
MOVES = frozenset({"explore", "compare", "accept", "revert", "recall", "yield"})
"""Decisions that move the knobs."""


class LastWindow(NamedTuple):
    """The last window learned: its configuration, its objective, and the share of its
    requests late or refused."""

    config: Knobs
    value: float
    late: float


class Policy:
    """The decision rule of one model's agent (see the module docstring). ``budget``: the core
    budget the gateway's models share; ``on_record``: called with every decision once it is
    recorded (the agent publishes it); ``clock``: the monotonic clock every pace and rest is
    timed by (a test's controlled one)."""

    def __init__(
        self,
        model: str,
        *,
        space: ConfigSpace,
        slo_ms: float,
        cores: int,
        settings: AgentSettings | None = None,
        seed: int = 0,
        budget: CoreBudget | None = None,
        on_record: Callable[[Decision], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.model, self._clock, self.budget, self._on_record = model, clock, budget, on_record
        self.settings = s = settings or AgentSettings()
        if s.algorithm not in ONLINE_TUNERS:
            raise ValueError(f"unknown online tuner {s.algorithm!r}; known: {ONLINE_TUNERS}")
        self.space, self.cores = space, cores
        self.objective = make_objective(s.objective, slo_ms=slo_ms, cores=cores)
        # Deferred: the GP tuners import scikit-learn (iotgw[tune]).
        from rrl.tuners.registry import build_tuner

        self.tuner: PerWorkload = build_tuner(
            s.algorithm, TuningProblem(space, self.objective, cores=cores, seed=seed)
        )
        self.queue_model = QueueModel(self.objective, cores=cores, settings=s.queue_model)
        self.memory = StateMemory()
        self.monitor = WorkloadMonitor(s.monitor)
        self.history: deque[Decision] = deque(maxlen=s.history)
        self.counts: dict[str, int] = {}
        self.current: Knobs | None = None
        self.incumbent: Knobs | None = None
        self.trial: Trial | None = None
        self.workload: WorkloadState | None = None
        self.verdict: Verdict | None = None
        self.last_rebuild_end, self.last_rebuild_s = -float("inf"), 0.0
        self._after: tuple[str, str] | None = None  # (kind, reason) of the interval after a trial
        self._recall: Knobs | None = None
        self._baseline: deque[Window] = deque(maxlen=BASELINE_WINDOWS)  # its last windows here
        self._since_trial = s.trial_gap
        self._last_measured: LastWindow | None = None
        self._incumbent_values: deque[float] = deque(maxlen=8)
        self._tick_counts: deque[float] = deque(maxlen=16)
        self._shortlist: list[Knobs] = []
        self._screened: tuple[float, StateKey | None, tuple[int, int]] = (-math.inf, None, (0, 0))
        self._draining = self._idle = self._storm_turned = False  # (a storm's turn: ``tick``)
        self._blocked: list[Knobs] = []
        self._gated_at = -math.inf
        self.rest = Rest(s.rest, s.interval_s)
        self._asked: tuple[StateKey, Knobs] | None = None  # where the gate let nothing through
        self._rests_on = ""  # why nothing is left to try there: what a rest's decisions repeat
        self._pending: list[tuple[Knobs, Arrivals, Measurement]] = []
        self.trust = ModelTrust(kappa=s.gate.kappa)
        self._searched: dict[StateKey, int] = {}  # measured-search trials per state
        self._losing: dict[StateKey, int] = {}  # those lost running, per state
        self._tie_lost: set[StateKey] = set()  # where a shorter timeout lost its trial
        self._search_trial_in: StateKey | None = None  # where the running one counts
        self._further: dict[StateKey, list[Knobs]] = {}  # beyond candidates that led (per state)
        self.load_kind, self.band = LoadKind(), ClosedLoopBand()  # band: closed-loop model error
        self._violating, self._noise_here, self.pair_spread = 0, 0.0, PairSpread()  # this state's

    def choose(self, queued: int = 0) -> Step:
        """The next interval's configuration and why, with ``queued`` requests waiting now
        (runs in a worker thread: the model simulates)."""
        assert self.current is not None and self.incumbent is not None
        self._calibrate_pending()
        arrivals = self.arrivals()
        if self._draining and self._is_backlog(queued):
            # Let what runs drain the backlog: a change (a rebuild above all) slows the drain.
            return Step(self.current, "drain", f"backlog of {queued} requests draining")
        if (back := self._fall_back(arrivals)) is not None:
            return back
        if self._recall is not None:
            self.incumbent, self._recall = self._recall, None
            self.trial = None
            return Step(
                self.incumbent,
                "recall",
                f"remembered for {self._key()}",
                self._predict(self.incumbent, arrivals),
            )
        if self._after is not None:
            (kind, reason), self._after = self._after, None
            return Step(self.incumbent, kind, reason, self._predict(self.incumbent, arrivals))
        if self.trial is not None:
            config = self.trial.next_config()
            kind = "explore" if config == self.trial.candidate else "compare"
            n = len(self.trial.windows) + 1
            reason = f"trial window {n}/{len(self.trial.schedule())} of {self.trial.candidate}"
            return Step(config, kind, reason, self._predict(config, arrivals))
        return self._consult_gate(arrivals)

    def _fall_back(self, arrivals: Arrivals) -> Step | None:
        """No harm stays: after ``fallback_windows`` incumbent windows running measured
        violating the SLO, the configuration measured best within it in this state, if any,
        becomes the incumbent again (the median of its last windows: one lucky window is not
        enough), forgiven the trial it lost; the violating incumbent is not tried here again."""
        assert self.incumbent is not None
        s = self.settings
        if self.trial is not None or self._violating < s.fallback_windows:
            return None
        key, incumbent = self._key(), self.incumbent
        limit = at_slo(self.objective, incumbent, s.violating_fraction)
        found = self.memory.within(key, limit, besides=incumbent)
        if found is None:
            return None
        config, median = found
        self.memory.reject(key, incumbent)
        self.memory.forgive(key, config)
        self.incumbent, self._violating = config, 0
        self._baseline.clear()
        self._incumbent_values.clear()
        self._since_trial = 0
        reason = (
            f"{incumbent} measured violating the SLO in {s.fallback_windows} windows running; "
            f"back to {config}, measured within it here (median J {median:.2f} of its last "
            f"windows, the limit {limit:.2f})"
        )
        return Step(config, "recall", reason, self._predict(config, arrivals))

    def _consult_gate(self, arrivals: Arrivals) -> Step:
        assert self.incumbent is not None
        target = None if self.budget is None else self.budget.should_yield(self.model)
        if target is not None and self._rebuild_allowed():
            step = self._yield_to(target, arrivals)
            if step is not None:
                return step
        urgent = self._incumbent_violates()
        recent = self._clock() - self._gated_at < self.settings.gate_every_s
        if recent and not urgent and self.verdict is not None:
            reason = f"gate asked {self.settings.gate_every_s:g}s ago: {self.verdict.reason}"
            return Step(self.incumbent, "exploit", reason, self._predict(self.incumbent, arrivals))
        if self._since_trial < self.settings.trial_gap and not urgent:
            gap = self.settings.trial_gap - self._since_trial
            return Step(
                self.incumbent,
                "exploit",
                f"{gap} incumbent window(s) before the next trial",
                self._predict(self.incumbent, arrivals),
            )
        verdict = self._verdict(arrivals)
        self.verdict, self._gated_at = verdict, self._clock()
        candidate, not_tried = verdict.candidate, ""
        if candidate is None and self.settings.measured_search:
            measured, why, predicted = self._measured_candidate(arrivals, verdict)
            if measured is not None:
                return self._start_trial(measured, why, verdict, search=True, blind=not predicted)
            not_tried = f"; {why}" if why else ""
        if candidate is None:
            held_back = self._held_back(arrivals)
            concluded = self.load_kind.closed or (
                self.queue_model.calibrated and verdict.considered > 0
            )
            if concluded and not held_back:
                # Nothing to try at this load (and no cores wanted from the budget): rest.
                self._asked = (self._key(), self.incumbent)
                self._rests_on = not_tried.removeprefix("; ") or verdict.reason
            reason = verdict.reason + not_tried + held_back
            return Step(self.incumbent, "exploit", reason, verdict.incumbent, verdict)
        return self._start_trial(candidate, verdict.reason, verdict)

    def _verdict(self, arrivals: Arrivals) -> Verdict:
        """The gate's verdict on the grid's shortlist and the tuner's proposal; in a closed
        loop, none: the gate predicts an open loop's queue at the arrival rate, while a closed
        loop's rate is what the incumbent serves, so the gate's gains there are not evidence,
        and screening the grid for them would take the cores the loop is measured on."""
        assert self.incumbent is not None
        if self.load_kind.closed:
            reason = (
                f"a closed loop of {self.load_kind.population} requests, which the open-loop "
                "prediction does not model (the closed-loop simulation ranks the measured search)"
            )
            return Verdict(None, None, None, 0.0, 0.0, 0, reason)
        candidates = self._candidates(arrivals)
        return decide(self.queue_model, arrivals, self.incumbent, candidates, self.settings.gate)

    def _start_trial(
        self,
        candidate: Knobs,
        reason: str,
        verdict: Verdict,
        *,
        search: bool = False,
        blind: bool = False,
    ) -> Step:
        """Try ``candidate`` against the incumbent (``rrl.agent.trial``), once the rebuild pace
        allows a candidate that rebuilds sessions (at once when the incumbent violates). A
        ``blind`` trial (the measured search: no predicted gain behind it) must win by twice
        the noise: a trial compares two or three windows a side, so a candidate no better than
        the incumbent clears one noise spread about one time in five, and the search runs a
        dozen; each false win moves the incumbent to a configuration no better, or worse.
        A ``search`` trial (the measured search's) counts in its state's budget of trials."""
        assert self.incumbent is not None
        rebuild = needs_rebuild(self.incumbent, candidate)
        if rebuild and not self._incumbent_violates() and not self._rebuild_allowed():
            wait = self._next_rebuild_at() - self._clock()
            reason = f"{candidate} waits {wait:.1f}s for the rebuild pace ({reason})"
            return Step(self.incumbent, "hold", reason, verdict.incumbent, verdict)
        # A measured-search trial counts in its state's budget once it begins (a hold above
        # does not); ``_enter_state`` gives the count back if a workload change drops it.
        self._search_trial_in = self._key() if search else None
        if self._search_trial_in is not None:
            key = self._search_trial_in
            self._searched[key] = self._searched.get(key, 0) + 1
        self.trial = Trial(
            self.incumbent,
            candidate,
            tuple(self._baseline),
            # Interleaved even when it rebuilds sessions: the gateway parks the sessions a
            # switch leaves, so switching back reuses them, and only interleaved windows tell a
            # worse candidate from a slower machine (rrl/README, "Where it stands": a candidate
            # kept on two windows read while the whole box served less).
            interleave=True,
            margin=self._trial_margin() * (2.0 if blind else 1.0),
            predicted_gain=verdict.gain,
            keep_on_tie=self._keeps_on_tie(candidate),
            **self._paired_trial(),
        )
        return Step(candidate, "explore", reason, verdict.best, verdict)

    def _paired_trial(self) -> dict[str, Any]:
        """In a closed loop, a trial decided by paired differences (``rrl.agent.trial``), with
        the spread of a difference pooled over this state's earlier trials, and the windows
        to resolve a gain of a few percent (``closed_loop_trial_windows``)."""
        if not self.load_kind.closed:
            return {}
        return {
            "by_pairs": True,
            "pair_noise": max(self.pair_spread.noise(), self.settings.trial_margin / 2),
            "min_gain": self.settings.trial_margin,
            "max_windows": self.settings.closed_loop_trial_windows,
        }

    def _measured_candidate(
        self, arrivals: Arrivals, verdict: Verdict
    ) -> tuple[Knobs | None, str, bool]:
        """The next configuration to measure near the incumbent when the gate let nothing
        through: the agent rests only once every neighbour (``rrl.agent.evidence.neighbours``)
        lost a measured trial in this state, not on a prediction. One notch beyond a lead
        first (``_onward``). In a closed loop the closed-loop simulation ranks them, the grid's
        best first; once the model's predictions of the incumbent missed
        (``rrl.agent.evidence.ModelTrust``), the tuner's own estimates (region estimates from
        measurements) do; with a model whose predictions held, its optimistic prediction
        does, and it still vetoes a neighbour it predicts to violate the SLO or to lose to the
        incumbent even by the optimistic bound that held for the incumbent. (None, why not)
        when there is none: none left, the search's budget (``measured_trials``) spent here,
        all ruled out by a model whose predictions held, or the model's error not proven yet
        (open loop). The third value: whether a measured lead or a predicted gain (the
        closed-loop simulation's, beyond a trial's margin) stands behind the pick, which then
        need not win by twice the noise."""
        assert self.incumbent is not None
        closed = self.load_kind.closed
        # An overloaded incumbent's windows never calibrate the model (refusals cap their
        # p95), so waiting for a proven model there would keep the overload for good: one
        # refusing a few percent of its requests, short of violating the SLO, as well.
        unproven = not self.queue_model.calibrated
        overloaded = self._incumbent_violates() or self._incumbent_overloaded()
        if not closed and unproven and not overloaded:
            return None, "", False
        key = self._key()
        if (searched := self._searched.get(key, 0)) >= self.settings.measured_trials:
            return None, f"the measured search ran its {searched} trials in this state", False
        if (losing := self._losing.get(key, 0)) >= self.settings.search_patience:
            return (
                None,
                (
                    f"the last {losing} configurations the search measured here each lost to the "
                    "incumbent (no gain beyond the noise): resting on those measurements"
                ),
                False,
            )
        if closed and (shorter := self._shorter_wait(key)) is not None:
            return *shorter, True
        leads = self._closed_loop_leads(key) if closed else []
        pool = self._search_pool(key, leads, closed)
        if not pool:
            return None, "every neighbour lost a measured trial in this state", False
        if (onward := self._onward(key, pool)) is not None:
            return *onward, True
        if closed:
            pick, why = self._closed_loop_pick(pool)
            if pick is None:
                return None, why, False
            best = pick
        elif not self.trust.trusted or unproven:
            best = min(pool, key=lambda c: _or_inf(self.tuner.predict(c)))
            why = f"{self._why_untrusted(unproven)}: candidates are tried on measurement"
        else:
            pick, why = self._safe_pick(pool, arrivals, verdict)
            if pick is None:
                return None, why, False
            best = pick
        return best, f"measured search: {why}; {len(pool)} neighbour(s) untried here", best in leads

    def _onward(self, key: StateKey, pool: list[Knobs]) -> tuple[Knobs, str] | None:
        """The first configuration in ``pool`` one notch beyond a candidate that led without
        clearing its trial's margin (``Outcome.led_by_half_the_margin``), if one is untried,
        and why: measured first, before what the models rank. A lead is a measurement; the
        closed-loop simulation, which put batch 32 at 1 ms and at 2 ms alike under 32 clients
        when the 1 ms trial had measured 6% ahead, would otherwise drop it as a form already
        measured, and the 2 ms that was best by 24% (bench find run 29) was never tried."""
        onward = self._further.get(key, [])
        pick = next((c for c in pool if c in onward), None)
        if pick is None:
            return None
        return pick, (
            f"measured search: {pick} lies one notch beyond a candidate that led the incumbent "
            "without clearing the margin (a measured lead: no prediction ranks or vetoes it); "
            f"{len(pool)} neighbour(s) untried here"
        )

    def _search_pool(self, key: StateKey, leads: list[Knobs], closed: bool) -> list[Knobs]:
        """What the measured search may measure next, in the order it ranks ties: what lies
        beyond a candidate that led, the closed-loop leads, then the neighbourhood; less what
        lost a trial here, what the core budget does not fit, and in a closed loop what the
        loop serves alike (``_unlike_in_loop``)."""
        assert self.incumbent is not None
        budget = self.budget
        further = [c for c in self._further.get(key, []) if c != self.incumbent]
        # In a closed loop the batch axis starts from the batch size the loop forms: from
        # batch 128 under 32 clients one notch down is 64, which forms the same batches, and
        # the smaller batches that do differ (16 splits the loop in two) would never be reached.
        origin = self._loop_form(self.incumbent) if closed else self.incumbent
        near = [c for c in neighbours(self.space, origin, self.cores) if c != self.incumbent]
        pool = [
            c
            for c in dict.fromkeys([*further, *leads, *near])
            if not self.memory.was_rejected(key, c)
            and not (budget is not None and not budget.fits(self.model, c))
        ]
        return self._unlike_in_loop(pool, key) if closed else pool

    def _loop_form(self, config: Knobs) -> Knobs:
        """What ``config`` serves a closed loop as: a loop of N single-row requests never
        queues more than N rows, so every batch size above N forms the same batches (none can
        fill; each takes all that waits) and refuses alike; they read as the smallest grid
        batch size above N. Without a batch timeout a batch of exactly N forms them too (a
        full batch and one that takes all that waits leave alike), so the form is the
        smallest that holds N. Requests of several rows keep their batch sizes (the rows a
        loop holds then vary)."""
        population = self.load_kind.population
        if self.monitor.rows_per_request > 1.0 or config.max_batch_size <= population:
            return config
        eager = config.batch_timeout_ms == 0
        form = min(
            b for b in self.space.batch_sizes if b > population or (eager and b == population)
        )
        return config.with_changes({"max_batch_size": form})

    def _unlike_in_loop(self, pool: list[Knobs], key: StateKey) -> list[Knobs]:
        """``pool`` less what a closed loop serves as the incumbent does, or as a configuration
        earlier in the pool or one that lost a trial here does (``_loop_form``): measuring
        batch 64 against 128 under 32 clients measures the machine's noise only."""
        assert self.incumbent is not None
        seen = {self._loop_form(self.incumbent)}
        seen.update(self._loop_form(c) for c in self.memory.rejected.get(key, set()))
        out = []
        for c in pool:
            form = self._loop_form(c)
            if form not in seen:
                seen.add(form)
                out.append(c)
        return out

    def _why_untrusted(self, unproven: bool) -> str:
        """Why the queueing model does not rank the measured search (open loop)."""
        if unproven:
            return (
                "the incumbent's windows are too overloaded to prove the model's error "
                f"(more than {OVERLOADED:.0%} late or refused)"
            )
        miss = self.trust.last_miss()
        return "the model's predictions missed" if miss is None else miss.describe()

    def _shorter_wait(self, key: StateKey) -> tuple[Knobs, str] | None:
        """In a closed loop, the shortest nonzero batch timeout (the incumbent's other knobs
        kept) that the closed-loop simulation predicts no slower than the incumbent and that
        has not lost a trial in this state, and why; None when there is none. A timeout longer
        than the loop needs to fill its batches gains nothing, and whenever a wave of answered
        clients splits (their turnaround varies; the simulation's never does) it waits out its
        whole length for a batch that cannot fill, and the loop answers far less in such
        spells (rrl/README, "Measurements behind the rules"). Its trial keeps it on a tie
        (``Trial.keep_on_tie``); once one such trial lost in this state, none is tried here
        again (the simulation's tie did not hold)."""
        assert self.incumbent is not None
        inc = self.incumbent
        if key in self._tie_lost:
            return None
        shorter = [
            c
            for c in dict.fromkeys(
                self.space.snap(inc.with_changes({"batch_timeout_ms": t}))
                for t in self.space.timeouts_ms
                if 0 < t < inc.batch_timeout_ms
            )
            if c != inc and not self.memory.was_rejected(key, c)
        ]
        tied = self._no_slower(shorter)
        if not tied:
            return None
        (ms, best), mine = min(tied[1:], key=lambda h: h[1].batch_timeout_ms), tied[0][0]
        return best, (
            f"a shorter timeout: {best} predicted {ms:.1f}ms per request by the closed-loop "
            f"simulation against the incumbent's {mine:.1f}ms; kept unless it measures slower"
        )

    def _keeps_on_tie(self, candidate: Knobs) -> bool:
        """Whether ``candidate`` is kept unless it measures slower (``Trial.keep_on_tie``):
        one within the cores against an incumbent that runs more threads than there are
        cores, or one that only shortens the incumbent's nonzero batch timeout and the
        closed-loop simulation predicts no slower (``_shorter_wait``). More threads than
        cores take time from everything else on the box (the event loop, the other models),
        so a trial that cannot tell the two apart should not keep them: run 46's wide start
        kept four instances of two threads on two cores for 60 s over one instance of two
        threads that led it by 7%, short of a margin of 8.5%."""
        inc = self.incumbent
        if inc is None:
            return False
        if threads_of(inc) > self.cores >= threads_of(candidate):
            return True
        if not self.load_kind.closed:
            return False
        if candidate.batch_timeout_ms <= 0 or not _only_shortens(candidate, inc):
            return False
        return bool(self._no_slower([candidate]))

    def _no_slower(self, configs: list[Knobs]) -> list[tuple[float, Knobs]]:
        """(predicted ms, config) of the incumbent first, then of each of ``configs`` the
        closed-loop simulation predicts no slower than it (within ``SAME_PREDICTION``); empty
        when none is, or nothing is predicted."""
        assert self.incumbent is not None
        if not configs:
            return []
        population = self.load_kind.population
        mine, *theirs = self.queue_model.closed_loop_many([self.incumbent, *configs], population)
        if mine is None:
            return []
        tied = [
            (ms, c)
            for c, ms in zip(configs, theirs, strict=True)
            if ms is not None and ms <= mine * (1.0 + SAME_PREDICTION)
        ]
        return [(mine, self.incumbent), *tied] if tied else []

    def _closed_loop_pick(self, pool: list[Knobs]) -> tuple[Knobs | None, str]:
        """The neighbour the closed-loop simulation predicts fastest per request among those
        its band (``rrl.agent.evidence.ClosedLoopBand``) does not rule out, and why; (None, why
        not) when it rules out every one: even at the most favourable ratio of measured to
        predicted time the simulation has shown in this state for a neighbour's kind, it is no
        faster than the incumbent measured by the trial's margin. Each neighbour is judged by
        its own kind's band: one the band cannot judge (a kind measured too little) is kept."""
        assert self.incumbent is not None
        population = self.load_kind.population
        lost = sorted(self.memory.rejected.get(self._key(), set()))
        mine, *theirs = self.queue_model.closed_loop_many(
            [self.incumbent, *pool, *lost], population
        )
        ranked = _new_forms(
            sorted(zip(theirs[: len(pool)], pool, strict=True), key=lambda h: _or_inf(h[0])),
            [(mine, self.incumbent)],
            list(zip(theirs[len(pool) :], lost, strict=True)),
        )
        if not ranked:
            return None, (
                f"not tried: {len(pool)} untried neighbour(s), each differing from one measured "
                "here only in a batch timeout the closed-loop simulation says the loop never "
                "waits out"
            )
        # The smallest margin a trial asks for, not the incumbent's noise: a noisy incumbent
        # must not make a neighbour easier to rule out.
        margin, band = self.settings.trial_margin, self.band
        kept = [
            (ms, c)
            for ms, c in ranked
            if ms is None or not band.rules_out(c, ms, self.incumbent, margin)
        ]
        if not kept:
            ms, best = ranked[0]
            assert ms is not None
            lowest, measured = band.lowest_ratio(best), band.measured_ms(self.incumbent)
            assert lowest is not None and measured is not None
            return None, (
                f"not tried: {len(pool)} untried neighbour(s), each ruled out by the band of "
                f"its kind; the best, {best}, predicted {ms:.1f}ms per request by the "
                "closed-loop simulation: at its most favourable error on the "
                f"{band.configurations_like(best)} configurations of its kind measured here "
                f"(measured {lowest:.2f}x predicted) none beats the incumbent's measured "
                f"{measured:.1f}ms by the margin ({margin:.0%})"
            )
        ms, best = kept[0]
        predicted = "unknown" if ms is None else f"{ms:.1f}ms"
        against = "" if mine is None else f" against the incumbent's {mine:.1f}ms"
        return best, (
            f"closed loop of {population} requests (the open-loop model does not apply): "
            f"{best} predicted {predicted} per request by the closed-loop simulation{against}"
        )

    def _closed_loop_leads(self, key: StateKey) -> list[Knobs]:
        """In a closed loop, the grid's configurations (within the cores and the budget) that
        the closed-loop simulation predicts faster than the incumbent by more than a trial's
        margin, best first, ``closed_loop_leads`` of them: a better split of the cores often
        needs a batch size or timeout to go with it, two or three notches away, where each
        single notch on the way measures worse."""
        assert self.incumbent is not None
        population, budget = self.load_kind.population, self.budget
        # A batch larger than the loop's population forms as the smallest one that holds it
        # (and batch 1 never waits): simulating those again says nothing new.
        holds = min((b for b in self.space.batch_sizes if b >= population), default=math.inf)
        grid = [
            c
            for c in self.space
            if not (
                c.max_batch_size > holds
                or (c.max_batch_size == 1 and c.batch_timeout_ms > 0)
                or c.concurrency * c.intra_op_threads > self.cores
                or c.inter_op_threads != self.incumbent.inter_op_threads
                or c == self.incumbent
                or self.memory.was_rejected(key, c)
                or (budget is not None and not budget.fits(self.model, c))
            )
        ]
        mine, *theirs = self.queue_model.closed_loop_many([self.incumbent, *grid], population)
        if mine is None:
            return []
        bar = mine * (1.0 - self._trial_margin())
        scored = [
            (ms, c) for ms, c in zip(theirs, grid, strict=True) if ms is not None and ms < bar
        ]
        scored.sort(key=lambda h: (h[0], h[1]))
        return [c for _, c in scored[: self.settings.closed_loop_leads]]

    def _safe_pick(
        self, pool: list[Knobs], arrivals: Arrivals, verdict: Verdict
    ) -> tuple[Knobs | None, str]:
        """The neighbour with the best optimistic prediction (``kappa`` deviations below its
        objective) among those whose optimistic prediction meets the SLO and beats the
        incumbent's prediction: a gain is possible within what the model has proven of its
        error. In the open loop every trial window of a worse configuration is paid for in the
        devices' tail latency, so one the model rules out is not measured. (None, why) when
        none is left."""
        inc = verdict.incumbent
        if inc is None:
            return None, ""
        kappa = self.settings.gate.kappa
        predicted = self.queue_model.predict_many([(c, arrivals, 1) for c in pool])
        safe = [
            (p.objective - kappa * p.sd, c, p)
            for c, p in zip(pool, predicted, strict=True)
            if p is not None
            and p.objective - kappa * p.sd < inc.objective
            and p.objective - kappa * p.sd
            <= at_slo(self.objective, c, self.settings.violating_fraction)
        ]
        if not safe:
            return None, (
                f"not tried: {len(pool)} untried neighbour(s) predicted no better than the "
                f"incumbent's J {inc.objective:.2f} even {kappa:g} sd below (the model's error, "
                f"{self.queue_model.error_ms():.2f}ms, proven on the incumbent's windows)"
            )
        _, best, p = min(safe, key=lambda h: (h[0], h[1]))
        return best, (
            f"{verdict.reason}; {best} predicted J {p.objective:.2f} +- {kappa * p.sd:.2f} "
            f"against {inc.objective:.2f}: measured before resting"
        )

    def _candidates(self, arrivals: Arrivals) -> list[Knobs]:
        """The model's shortlist of the grid (screened every ``screen_every_s``, or when the
        state or the arrivals change) and the tuner's proposal, minus what the tuner's estimates
        put beyond ``explore_regret`` x the incumbent and what lost a trial in this state."""
        assert self.incumbent is not None
        key = self._key()
        now = self._clock()
        at, last_key, bucket = self._screened
        if (
            now - at > self.settings.screen_every_s
            or key != last_key
            or bucket != arrivals.bucket()
        ):
            grid = self._grid()
            gate = self.settings.gate
            self._shortlist = screen(self.queue_model, arrivals, grid, gate.shortlist, gate.kappa)
            self._screened = (now, key, arrivals.bucket())
        proposal = self.tuner.propose()
        # The model does not tell inter-op threads apart: only the incumbent's are compared.
        same_inter = proposal.inter_op_threads == self.incumbent.inter_op_threads
        candidates = [*self._shortlist, *([proposal] if same_inter else [])]
        limit = self.tuner.predict(self.incumbent)
        allowed = [
            c
            for c in candidates
            if not self.memory.was_rejected(key, c)
            and not (
                limit is not None
                and (p := self.tuner.predict(c)) is not None
                and p > self.settings.explore_regret * limit
            )
        ]
        budget = self.budget
        self._blocked = [c for c in allowed if budget and not budget.fits(self.model, c)]
        return [c for c in allowed if c not in self._blocked]

    def _grid(self) -> list[Knobs]:
        """What the gate screens: one inter-op thread (the served graphs are chains), and the
        timeouts of eager batching and of the incumbent: a few dozen configurations."""
        assert self.incumbent is not None
        timeouts = {0.0, self.incumbent.batch_timeout_ms}
        return [
            c
            for c in self.space
            if c.inter_op_threads == self.space.inter_op_threads[0]
            and c.batch_timeout_ms in timeouts
        ]

    def _held_back(self, arrivals: Arrivals) -> str:
        """When a candidate the core budget held back would have cleared the gate, tell the
        budget this model wants the cores (another model may yield them)."""
        if not self._blocked or self.budget is None or self.incumbent is None:
            return ""
        verdict = decide(
            self.queue_model, arrivals, self.incumbent, self._blocked, self.settings.gate
        )
        if verdict.candidate is None:
            return ""
        self.budget.want(self.model, threads_of(verdict.candidate))
        return f"; {verdict.candidate} would clear the gate, but the core budget holds it back"

    def _yield_to(self, threads: int, arrivals: Arrivals) -> Step | None:
        """Come down to ``threads`` for another model the budget says wants the cores: the best
        configuration within them predicted to meet the SLO, kept unless measured violating it
        (``rrl.agent.budget``); None when none is predicted to."""
        assert self.incumbent is not None
        limit = at_slo(self.objective, self.incumbent, self.settings.violating_fraction)
        key = self._key()
        within = [
            c
            for c in self._grid()
            if threads_of(c) <= threads and not self.memory.was_rejected(key, c)
        ]
        gate = self.settings.gate
        for config in screen(self.queue_model, arrivals, within, 1, gate.kappa):
            p = self._predict(config, arrivals)
            if p is not None and p.objective <= limit:
                self._search_trial_in = None
                self.trial = Trial(
                    self.incumbent,
                    config,
                    tuple(self._baseline),
                    interleave=False,
                    margin=self._trial_margin(),
                    accept_below=limit,
                )
                reason = (
                    f"core budget: another model wants cores or the cores are crowded, down to "
                    f"{threads} thread(s); {config} predicted J {p.objective:.2f} within the SLO"
                )
                return Step(config, "yield", reason, p)
        return None

    # What the loop tells the rule (``rrl.agent.model_agent``: it applies, measures and ticks).

    def begin(self, config: Knobs) -> None:
        """The configuration in effect when the agent starts: the first incumbent."""
        self.current = self.incumbent = self._applied = config
        if self.budget is not None:
            # No arrivals yet, so no core kept busy: a model that never sees traffic must not
            # count as crowding the cores (every other model's first move was a yield to one
            # thread beside an idle model); its first measured window reports what it keeps busy.
            self.budget.report(self.model, config, 0.0, busy_cores=0.0)

    def in_effect(self, config: Knobs) -> None:
        """The knobs in effect as an interval begins. Knobs set by hand meanwhile (not what
        this agent applied last) are the new incumbent, and a trial in progress is dropped."""
        self.current = config
        if config != self._applied:
            self.incumbent = self._applied = config
            self.trial, self._violating = None, 0

    def applied(self, config: Knobs, rebuild: tuple[float, float] | None = None) -> None:
        """``config`` is in effect now; ``rebuild``: (start, end) of the session rebuild it
        took, which paces the next one."""
        self.current = self._applied = config
        if rebuild is not None:
            started, ended = rebuild
            self.last_rebuild_end, self.last_rebuild_s = ended, ended - started

    def failed(self, step: Step, error: str, in_effect: Knobs) -> None:
        """The gateway could not build ``step.config``: never proposed again, and a trial of it
        lost in this state."""
        self.tuner.exclude(step.config)
        if self.trial is not None and step.config == self.trial.candidate:
            self.memory.reject(self._key(), step.config)
            self.trial = None
        self._record(Decision(time.time(), self.model, "failed", step.config, self.workload, error))
        self.current = self._applied = in_effect

    def idle(self, reason: str) -> None:
        """Too little traffic to measure: one 'idle' decision when the model goes quiet (not one
        per interval); an idle model's share of the core budget is one thread, kept idle."""
        if not self._idle and self.current is not None:
            self._idle = True
            if self.budget is not None:
                self.budget.report(self.model, self.current, 0.0, busy_cores=0.0)
            self._record(
                Decision(time.time(), self.model, "idle", self.current, self.workload, reason)
            )

    def busy(self) -> None:
        """Traffic enough to measure again."""
        self._idle = False

    def tick(self, now: float, stats: WindowStats, span_s: float) -> str | None:
        """One tick's arrivals (``stats`` over the last ``span_s``): "state" if the workload
        state changed, "wake" if a resting agent woke, else None."""
        # Arrivals, not completions: completions read a building queue short.
        state = self.monitor.update(now, stats.arrived, stats.arrived_rows)
        self._tick_counts.append(stats.arrived * self.settings.tick_s / span_s)
        self.load_kind.observe(stats.in_system_peak, stats.rejected)
        changed = self.monitor.state is not None and state != self.workload
        turned = self.load_kind.turned() and self.monitor.state is not None
        if (changed and not self.load_kind.same_loop()) or self.load_kind.another_loop() or turned:
            self.workload, self._storm_turned = state, turned
            # Counts from before a step would read the step itself as burstiness.
            self._tick_counts.clear()
            return "state"
        # A closed loop's arrivals follow its service: not asked (this runs on the event loop).
        if self.load_kind.same_loop():
            return None
        surprise = self.rest.surprised(stats.arrived, stats.arrived_rows, span_s)
        if surprise is not None:
            self.wake(surprise)
            return "wake"
        return None

    def workload_changed(self, config: Knobs, rebuilt: bool) -> None:
        """Record the new workload state (running ``config``) and enter it."""
        changes = self.monitor.changes
        rate = changes[-1].rate_per_s if changes else self.monitor.rate_per_s
        reason = f"rate {rate:.1f}/s"
        if self.load_kind.storm:
            reason = (
                f"refusals in most ticks: read as a closed loop of {self.load_kind.population} "
                f"requests judged by what it answers, rate {self.monitor.rate_per_s:.1f}/s"
            )
        elif self.load_kind.another_loop():
            reason = (
                f"a closed loop of {self.load_kind.population} requests after one of "
                f"{self.load_kind.held}, rate {self.monitor.rate_per_s:.1f}/s"
            )
        self._record(
            Decision(
                time.time(), self.model, "workload", config, self.workload, reason, rebuilt=rebuilt
            )
        )
        self._enter_state()

    def not_measured(self, step: Step, event: str) -> None:
        """An interval straddled a step (``event``: "state" or "wake"): not learned. A step that
        moved the knobs (a trial's start or end above all) is logged all the same: the log must
        say why the knobs moved."""
        if step.kind in MOVES:
            moved = "the workload changed" if event == "state" else "the load moved"
            why = f"{step.reason} (not measured: {moved})"
            self._record(
                Decision(time.time(), self.model, step.kind, step.config, self.workload, why)
            )

    # Resting (``rrl.agent.resting``): nothing simulated while nothing moves.

    def rest_step(self) -> Step | None:
        """The step while resting (the incumbent, from the cache: nothing is simulated), or
        None after waking because the load moved or the budget wants cores."""
        if not self.rest.resting or self.incumbent is None or self.rest.state is None:
            return None
        if self.trial is not None or self._recall is not None or self._after is not None:
            self.rest.wake()  # a trial or a recall was set from outside the rules: it runs
            return None
        rest = self.rest.state
        arrivals = self.arrivals()
        drift = abs(math.log2(max(arrivals.rate_per_s, 1e-3) / max(rest.rate_per_s, 1e-3)))
        if rest.key != (self._key(), self.incumbent):
            self.wake("the workload key or the incumbent changed")
            return None
        # A closed loop's rate is what the incumbent serves it: it moves with the machine (a
        # loop of 32 on sensor_mlp read 2,300-4,100/s at rest on one configuration), and a
        # loop served worse wakes the rest by its time per request (``Rest.degraded``).
        if drift > 0.5 and not self.load_kind.same_loop():
            self.wake(f"rate {arrivals.rate_per_s:.1f}/s against {rest.rate_per_s:.1f}/s at rest")
            return None
        if self.budget is not None and self.budget.should_yield(self.model) is not None:
            self.wake("the core budget asks for cores")
            return None
        if self.rest.due_for_recheck(self._clock()):
            self._gated_at = -math.inf  # the gate asked again; a "no" rests again, longer
            key, patience = self._key(), self.settings.search_patience
            if self._losing.get(key, 0) >= patience:  # and the search measures one more
                self._losing[key] = patience - 1
            return None
        reason = (
            f"resting since {self._clock() - rest.since:.0f}s, the incumbent meeting the SLO "
            f"with margin: {self._rests_on or 'the gate let nothing through at this load'}; "
            f"next window {rest.interval_s:g}s"
        )
        return Step(
            self.incumbent, "exploit", reason, self.queue_model.cached(self.incumbent, arrivals)
        )

    def _after_incumbent_window(self, m: Measurement) -> None:
        """Rest (or rest longer) after a window of the incumbent that met the SLO with margin,
        once the gate concluded at this load; wake after one that did not."""
        s = self.settings.rest
        assert self.incumbent is not None
        # A closed loop's p95 is its clients' doing (N of them always waiting): its time per
        # request says whether the configuration serves them worse.
        per_request = self.load_kind.per_request_ms(m.throughput_per_s)
        p95, what = (m.p95_ms, "p95") if per_request is None else (per_request, "time per request")
        margin = p95 <= s.p95_fraction * self.objective.slo_ms and m.slo_violations == 0
        if not margin:
            self.wake(f"incumbent {what} {p95:.1f}ms, {m.slo_violations} late: no margin")
            return
        if (worse := self.rest.degraded(p95)) is not None:
            self.wake(worse)
            return
        key = (self._key(), self.incumbent)
        self.rest.note(key, p95)
        if s.enabled and (self.rest.resting or self._asked == key):
            self.rest.begin(
                self._clock(), self.monitor.rate_per_s, self.monitor.rows_per_request, key
            )

    def wake(self, reason: str) -> None:
        """Back to the shortest interval, the gate asked at once; recorded when it rested."""
        if self.rest.wake() and self.incumbent is not None:
            self._gated_at = -math.inf
            self._record(
                Decision(time.time(), self.model, "wake", self.incumbent, self.workload, reason)
            )

    def _calibrate_pending(self) -> None:
        """Calibrate the model with the windows whose prediction was not cached (simulated
        here, in the worker thread or the model's process, never on the event loop)."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        asks = [(c, a, None) for c, a, _ in pending]
        for (_, _, m), p in zip(pending, self.queue_model.predict_many(asks), strict=True):
            if p is not None:
                self.queue_model.calibrate(p, m)

    def _predict(self, config: Knobs, arrivals: Arrivals | None = None) -> Prediction | None:
        return self.queue_model.predict_many([(config, arrivals or self.arrivals(), None)])[0]

    def arrivals(self) -> Arrivals:
        """The arrival process now: the monitor's rate, burstiness from the counts per tick
        (their index of dispersion, which is the gaps' squared CV for a renewal process)."""
        return Arrivals(self.monitor.rate_per_s, self.dispersion(), self.monitor.rows_per_request)

    def dispersion(self) -> float:
        return index_of_dispersion(list(self._tick_counts))

    def _key(self) -> StateKey:
        """The workload state's key. A closed loop's arrivals follow its service: their
        dispersion measures the knobs (a trial of a slower candidate halves a tick's count),
        not the devices, so while the state is held for a loop it is never bursty; keyed by
        it, the trials the search spent, the candidates it rejected and the incumbent it
        remembered would split between two keys as trials came and went, and each rejected
        candidate be tried again under the other."""
        dispersion = 0.0 if self.load_kind.held is not None else self.dispersion()
        return StateKey.of(self.workload or WorkloadState(0), dispersion)

    def learn(
        self,
        step: Step,
        measurement: Measurement,
        rebuilt: bool = False,
        *,
        queued: tuple[int, int] = (0, 0),
    ) -> Decision:
        """Tell the tuner and the model what ran and what it gave; move the trial on. An
        interval that drained a backlog (``queued``: the queue at its start and end) is
        recorded but not learned (the drain rule). The online agent runs it in a worker
        thread, as ``choose``: a trial's windows are normalised by predictions the model may
        have to simulate."""
        start, end = queued
        self._draining = self._is_backlog(start) and end < start
        if self._draining:
            return self._record_drain(step, measurement, rebuilt, queued)
        config = step.config
        value = self.value_of(config, measurement)
        self._last_measured = LastWindow(config, value, measurement.violation_fraction)
        load = measurement.arrival_rate_per_s  # the load it ran under (not its backlog's)
        if self.monitor.in_band(load):  # not a window straddling a step
            self.memory.note(self._key(), config, value)
        if self.budget is not None:
            busy = self.queue_model.busy_cores(config, measurement)
            self.budget.report(self.model, config, measurement.rate_per_s, busy)
        self.tuner.observe(config, measurement)
        self._calibrate(config, measurement)
        self._observe_band(config, measurement)
        reason = step.reason
        incumbent_window = False
        outcome = self._trial_window(config, value, measurement)
        if outcome is not None:
            reason = f"{reason}; {outcome.reason}" if reason else outcome.reason
        elif self.trial is None and config == self.incumbent:
            self._incumbent_window(config, value, load)
            incumbent_window = True
            # The model predicts an open-loop p95; a closed loop's value is another figure.
            judged = self.queue_model.calibrated and not self.load_kind.closed
            if step.predicted is not None and judged:
                self.trust.judge(step.predicted.objective, step.predicted.sd, value)
        decision = self._record(
            Decision(
                time.time(),
                self.model,
                step.kind,
                config,
                self.workload,
                reason,
                value,
                measurement,
                rebuilt,
                step.predicted,
                step.gate,
            )
        )
        if incumbent_window:  # after the window's own record: rest longer, or wake
            self._after_incumbent_window(measurement)
        return decision

    def _observe_band(self, config: Knobs, measurement: Measurement) -> None:
        """A closed loop's window against the closed-loop simulation's prediction for it."""
        measured = self.load_kind.per_request_ms(measurement.throughput_per_s)
        if measured is None:
            return
        predicted = self.queue_model.closed_loop_ms(config, self.load_kind.population)
        if predicted is not None:
            self.band.observe(config, predicted, measured)

    def _record_drain(
        self, step: Step, measurement: Measurement, rebuilt: bool, queued: tuple[int, int]
    ) -> Decision:
        start, end = queued
        reason = (
            f"{step.kind}: queue {start} -> {end} requests, measured the backlog "
            "draining (not learned)"
        )
        return self._record(
            Decision(
                time.time(),
                self.model,
                "drain",
                step.config,
                self.workload,
                reason,
                measurement=measurement,
                rebuilt=rebuilt,
                predicted=step.predicted,
            )
        )

    def _calibrate(self, config: Knobs, measurement: Measurement) -> None:
        """Only a cached prediction calibrates now; the rest at the next step that asks the
        model anyway (``_calibrate_pending``, all in one call), none while resting. Not a closed
        loop's window: the model predicts an open loop's p95, and a closed loop's is its
        clients' doing (the closed-loop band judges the closed-loop simulation instead)."""
        if self.load_kind.closed:
            return
        seen = Arrivals(
            measurement.arrival_rate_per_s, self.dispersion(), measurement.rows_per_request
        )
        predicted = self.queue_model.cached(config, seen)
        if predicted is not None:
            self.queue_model.calibrate(predicted, measurement)
        elif not self.rest.resting:
            self._pending.append((config, seen, measurement))
            del self._pending[: -self.queue_model.settings.residuals_kept]

    def _trial_window(self, config: Knobs, value: float, m: Measurement) -> Outcome | None:
        trial = self.trial
        if trial is None:
            return None
        # Normalised at the load each window ran under: the rate answered moves with the
        # backlog a window builds or drains, and a window that inherits a candidate's backlog
        # answers less, which read as a lighter load made its objective look worse still.
        load = m.arrival_rate_per_s
        outcome = trial.record(config, value, load, self._normalise)
        # Beyond the safety limit a candidate goes back at once while the incumbent's last
        # window met it. When that window was beyond it too (an overloaded incumbent, a
        # storm's every window), the limit guards nothing and the candidate may be the way
        # out: the trial's own revert decides, which waits for the incumbent's window beside
        # the candidate's. Against the last window alone, run 43's storm (128 clients, the
        # incumbent's windows 650-1,025 per request) reverted three candidates in a row on
        # one window each, the search then rested on those losses at 0.26x the best static.
        limit = self._unsafe_value(config)
        base = trial.baseline[-1].objective if trial.baseline else None
        unsafe = value > limit and (base is None or base <= limit)
        if outcome is None and config == trial.candidate and unsafe:
            outcome = Outcome(
                "revert",
                value,
                math.nan,
                load,
                f"{config} measured J {value:.2f}: beyond the safety limit, "
                "reverted after one window",
            )
        if outcome is None:
            return None
        self.trial = None
        self._since_trial = 0
        if trial.by_pairs and outcome.verdict != "revert":
            self.pair_spread.add(trial.paired_differences)
        key = self._key()
        searched, self._search_trial_in = self._search_trial_in, None
        if outcome.verdict == "accept":
            self._losing.pop(key, None)
            self.memory.reject(key, trial.incumbent)  # it lost: not tried again in this state
            self.incumbent, self._violating = trial.candidate, 0
            self.memory.remember(key, trial.candidate, outcome.candidate)
            # Its trial windows are the new incumbent's first measurements here.
            won = [w for w in trial.windows if w.config == trial.candidate]
            self._baseline = deque(won[-BASELINE_WINDOWS:], maxlen=BASELINE_WINDOWS)
            self._incumbent_values.clear()
            self._after = ("accept", outcome.reason)
        else:
            self._lost(trial, outcome, key, searched is not None)
        return outcome

    def _lost(self, trial: Trial, outcome: Outcome, key: StateKey, searched: bool) -> None:
        """What a trial's candidate losing in state ``key`` teaches (``searched``: a trial of
        the measured search's)."""
        self.memory.reject(key, trial.candidate)
        self._after = ("revert", outcome.reason)
        led = outcome.verdict == "reject" and outcome.led_by_half_the_margin()
        further = beyond(self.space, trial.incumbent, trial.candidate, self.cores)
        if led and further is not None:  # well ahead, not by the margin: one notch on
            self._further.setdefault(key, []).append(further)
        elif searched and trial.keep_on_tie and _only_shortens(trial.candidate, trial.incumbent):
            # A shorter timeout was tried for a tie the simulation predicted, not for a gain:
            # its loss says the simulation's tie does not hold here, so no shorter timeout is
            # tried again in this state, and the search's patience is kept for gains (run 43:
            # three timeouts lost in a row and the search rested on them).
            self._tie_lost.add(key)
        elif searched:
            # A lead is no loss: the search does not rest while the gain it hints at is one
            # notch further and unmeasured.
            self._losing[key] = self._losing.get(key, 0) + 1

    def _incumbent_window(self, config: Knobs, value: float, rate: float) -> None:
        self._baseline.append(Window(config, value, rate))
        self._violating = self._violating + 1 if self._violates(config, value) else 0
        self._incumbent_values.append(value)
        if len(self._incumbent_values) >= 3:  # before three, the last measured here stands
            self._noise_here = relative_noise(list(self._incumbent_values), 0.0)
        self._since_trial += 1
        # A window straddling a step is measured at the old load but labelled with the new
        # state until the monitor notices; remembering it would overwrite what that state
        # learned (a trickle's first window relabelling a busy state's knobs).
        if self.monitor.in_band(rate):
            self.memory.remember(self._key(), config, value)

    def value_of(self, config: Knobs, measurement: Measurement) -> float:
        """The objective of a measured window; in a closed loop its time per request by
        Little's law (``LoadKind.per_request_ms``) stands in for the p95 (the SLO's penalty for
        late answers is kept). In a storm (``LoadKind.storm``) the refusals are left out: they
        count how fast the gateway refuses clients that send again at once, not what the
        configuration serves; it is judged on what it answered, a window that answered none as
        if it had answered one."""
        if self.load_kind.storm and measurement.duration_s > 0:
            answered = max(measurement.completed, 1)
            measurement = replace(
                measurement,
                offered=answered,
                completed=answered,
                slo_violations=max(0, measurement.slo_violations - measurement.rejected),
                rejected=0,
            )
        per_request_ms = self.load_kind.per_request_ms(measurement.throughput_per_s)
        if per_request_ms is not None:
            measurement = replace(measurement, p95_ms=per_request_ms)
        return self.objective(config, measurement)

    def _normalise(self, config: Knobs, value: float, seen: float, common: float) -> float:
        """``value`` measured at ``seen`` requests/s, expressed at ``common`` by the model's
        ratio between the two rates (the same trace seed on both sides)."""
        if seen <= 0 or common <= 0 or math.isclose(seen, common):
            return value
        if self.load_kind.closed:
            # The same clients on both sides: the rate is what each configuration served, and
            # a faster one has the higher rate by Little's law, not a heavier load to excuse.
            return value
        a = self.arrivals()
        # Both at once, and in the model's process when it has one: a simulation here would
        # hold the interpreter lock the gateway's event loop needs.
        at_seen, at_common = self.queue_model.predict_many(
            [(config, replace(a, rate_per_s=rate), 1) for rate in (seen, common)]
        )
        if at_seen is None or at_common is None or at_seen.objective <= 0:
            return value
        return value * at_common.objective / at_seen.objective

    def _trial_margin(self) -> float:
        """The noise of the incumbent's windows, at least ``trial_margin``; before a new
        incumbent has three windows of its own, the noise its predecessor's showed in this
        state. The machine's noise does not leave with a configuration: after an accepted
        trial the floor alone (5%) judged the next trial, and at vision_cnn's 171/s, where one
        configuration's windows spread 27-58%, the search accepted on that noise six times
        in one run (run 30)."""
        return max(self.settings.trial_margin, self._noise_here)

    def _enter_state(self) -> None:
        """A new workload state: the tuner moves to its table, a trial in progress is dropped
        (its windows straddle two loads), and the configuration remembered for the state, if
        any, runs next."""
        assert self.workload is not None
        self.tuner.set_workload(self.workload)
        self._draining = False
        self._baseline.clear()
        self._incumbent_values.clear()
        self._noise_here = 0.0  # another load: its noise is measured anew
        self.pair_spread.clear()
        self._violating = 0
        self._gated_at = -math.inf
        self._asked = None
        self.trust.reset()
        self.band.reset()
        if self.load_kind.another_loop() or self._storm_turned:
            # What the last loop measured in this state (its times per request, the trials
            # it lost) says nothing of this one; its best configuration is a fair start. So
            # for a storm's turn: the same key's windows were valued by another figure.
            self._storm_turned = False
            key = self._key()
            self.memory.forget_measured(key)
            self._searched.pop(key, None)
            self._losing.pop(key, None)
            self._tie_lost.discard(key)
            self._further.pop(key, None)
        self.load_kind.hold()
        self.rest.wake()  # the "workload" decision says why
        if self.trial is not None:
            self.trial = None
            self._after = ("revert", "workload changed during the trial: incumbent restored")
            if (dropped := self._search_trial_in) is not None and self._searched.get(dropped):
                # Load that comes in bursts (a benchmark's rounds, a user's sweep) ends trials
                # this way, and counted they spent the search on verdicts it never had.
                self._searched[dropped] -= 1
        self._search_trial_in = None
        remembered = self.memory.recall(self._key())
        if remembered is not None and remembered.config != self.incumbent:
            self._recall = remembered.config
            self._after = None

    def _is_backlog(self, queued: int) -> bool:
        s = self.settings
        return queued >= max(s.min_backlog, self.monitor.rate_per_s * s.backlog_s)

    def _incumbent_violates(self) -> bool:
        last = self._last_measured
        return (
            last is not None
            and last.config == self.incumbent
            and self._violates(last.config, last.value)
        )

    def _incumbent_overloaded(self) -> bool:
        """Whether the incumbent's last window was too overloaded to calibrate the model."""
        last = self._last_measured
        return last is not None and last.config == self.incumbent and last.late > OVERLOADED

    def _violates(self, config: Knobs, value: float) -> bool:
        """Whether a window of ``config`` valued ``value`` counts as violating the SLO."""
        return value > at_slo(self.objective, config, self.settings.violating_fraction)

    def _unsafe_value(self, config: Knobs) -> float:
        return at_slo(self.objective, config, self.settings.unsafe_violation_fraction)

    def _rebuild_allowed(self) -> bool:
        return self._clock() >= self._next_rebuild_at()

    def _next_rebuild_at(self) -> float:
        s = self.settings
        gap = max(s.min_rebuild_gap_s, self.last_rebuild_s / s.rebuild_duty)
        return self.last_rebuild_end + gap

    def _record(self, decision: Decision) -> Decision:
        self.history.append(decision)
        self.counts[decision.kind] = self.counts.get(decision.kind, 0) + 1
        log.info("tuner %s %s", self.model, log_line(decision))
        if self._on_record is not None:
            self._on_record(decision)
        return decision


def _only_shortens(candidate: Knobs, incumbent: Knobs) -> bool:
    """Whether ``candidate`` is ``incumbent`` with a shorter batch timeout."""
    return (
        candidate.batch_timeout_ms < incumbent.batch_timeout_ms
        and candidate.with_changes({"batch_timeout_ms": incumbent.batch_timeout_ms}) == incumbent
    )


def _or_inf(value: float | None) -> float:
    return math.inf if value is None else value


def _new_forms(
    ranked: list[tuple[float | None, Knobs]],
    measured: list[tuple[float | None, Knobs]],
    lost: Sequence[tuple[float | None, Knobs]] = (),
) -> list[tuple[float | None, Knobs]]:
    """``ranked`` less each configuration that differs from one measured (or from one ranked
    before it) only in its batch timeout, with the same closed-loop prediction: a loop that
    always has a batch's worth waiting never waits out a timeout, so such a trial measures the
    machine's noise only (a run tried batch 4 at 2, 4 and 8 ms one after another, after batch 4
    at 1 ms had run: three trials of what the simulation predicted alike, 52.7 ms a request).
    Against one that ``lost`` a trial, the batch size does not count either: the same split of
    the cores predicted alike is the prediction that measurement refuted (a run lost batch 4,
    8 and 2 on two single-thread instances one after another, each predicted at 13.9 ms, and
    rested before it measured a larger batch on its own split)."""

    def form(config: Knobs) -> Knobs:
        return config.with_changes({"batch_timeout_ms": 0.0})

    def split(config: Knobs) -> Knobs:
        return config.with_changes({"batch_timeout_ms": 0.0, "max_batch_size": 1})

    def alike(ms: float, m: float) -> bool:
        return abs(ms - m) <= SAME_PREDICTION * m

    seen = [(m, form(c)) for m, c in [*measured, *lost] if m is not None]
    refuted = [(m, split(c)) for m, c in lost if m is not None]
    out = []
    for ms, config in ranked:
        mine = form(config)
        if ms is not None and (
            any(f == mine and alike(ms, m) for m, f in seen)
            or any(f == split(config) and alike(ms, m) for m, f in refuted)
        ):
            continue
        if ms is not None:
            seen.append((ms, mine))
        out.append((ms, config))
    return out
