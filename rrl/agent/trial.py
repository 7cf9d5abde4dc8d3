"""A fair comparison of a candidate with the incumbent, on the same load, and the revert.

A trial starts from the incumbent's last windows in the workload state (the baseline, up to
``BASELINE_WINDOWS``) and runs

- interleaved (what the agent's own trials do): candidate, incumbent, candidate, so a drift of
  the load or of the machine hits both sides alike; of the baseline its last two windows join
  the incumbent's side (three windows for a median that one slow window cannot move). A
  candidate that changes threads or instances too: the gateway parks the sessions a switch
  leaves (``gateway.batching.instances``), so switching back and forth builds once, and
  windows read at different times cannot tell a worse candidate from a slower machine;
- paired (``interleave=False``, the core budget's yield, which only asks whether the
  candidate meets the SLO): candidate windows only, against the whole baseline: one incumbent
  window would let its noise decide (rrl/README has the trial that showed it).

Windows at different arrival rates do not compare configurations, so every window's measured
objective is normalised to the trial's common rate (the mean of its windows' rates) by the
queueing model's own sensitivity to the rate: ``J * P(config, common) / P(config, seen)``,
with P the model's prediction. The model's level may be off; its ratio between two nearby rates
is what it knows best.

Rules:

- **revert within one window**: a candidate whose first window's normalised objective is
  worse than the baseline's by more than the noise margin goes back, and costs one window:
  paired, at once; interleaved, after the incumbent's window the schedule runs next, and only
  if the candidate is worse than that window by the margin too (the baseline was read before
  the trial: a machine that slowed since reads as a worse candidate);
- **accept**: at the end, the candidate's median normalised objective beats the incumbent's by
  more than the margin; otherwise the incumbent stays (a tie keeps what is known), except for
  a candidate that only shortens the batch timeout and is predicted no slower
  (``keep_on_tie``): it is kept unless it measured slower, since a longer timeout that fills
  the same batches gains nothing and waits out its whole length whenever a batch cannot fill;
- **beside**: an interleaved candidate is kept only if it is also ahead of the incumbent's
  windows inside the trial: the baseline's window was read before it, and a lead that only
  that window gives may be a machine that was slower then;
- **extend**: a candidate ahead at the end but not by the margin (or not beside the
  incumbent) runs another round (one more
  window a side, or one more candidate window when paired), up to ``max_windows``: the
  margin is for one window a side and shrinks as the sides hold more windows (by the standard
  error of a difference of means, ``sqrt((1/n_c + 1/n_i) / 2)``), so a gain smaller than one
  window's noise is resolved by measuring longer rather than given up.

In a **closed loop** an interleaved trial is decided by **paired differences** instead
(``by_pairs``): each candidate window's log objective less the mean of the incumbent windows
on either side of it in time (the baseline's last window before the first), so a drift of the
machine's speed cancels in each difference, and the verdict asks their mean for a gain beyond
``min_gain`` and beyond twice its standard error (``EARLY_LOOK_Z``; ``LAST_LOOK_Z`` at the
last look the windows allow). Measured on this box (sensor_mlp, 32 clients,
one static configuration for 44 s): the rate of half-second windows spread 15% about its mean
over the run, two adjacent windows differed by a median 6% (rrl/README, "Measurements behind
the rules"); a margin read from the spread of windows across the run (below) asked 20-67% of
candidates whose true difference was 10-20%, while the medians of two or three windows a side,
the baseline read before the trial among them, let drift decide. The spread of a difference is
pooled over the state's earlier trials (``pair_noise``, a prior of two degrees of freedom), so
two or three differences do not stand on their own sample deviation.

Each side is read by its **median** window (the mean of two): one window in a few carries the
machine's hiccups or a change's aftermath (a rebuild's first requests, a backlog the last
configuration left, a burst of late answers that the SLO's penalty doubles), and a mean lets
that one window decide the trial either way.

The margin is ``max(min_margin, noise)``, noise the relative spread of the incumbent's recent
windows read the same robust way (the median absolute deviation scaled to a standard
deviation), twice that for a candidate no prediction stands behind (``rrl.agent.policy``): one
outlier window would otherwise widen the margin for the next eight trials until no real gain
clears it.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from models.knobs import Knobs

BASELINE_WINDOWS = 3
"""The incumbent's windows a paired trial is compared with, at most."""

DEFAULT_PAIR_NOISE = 0.10
"""The spread of one paired difference before a state's trials have measured it: what a closed
loop of sensor_mlp measured here with the knobs switched every window and no agent running
(7-12%; rrl/README, "Measurements behind the rules")."""

EARLY_LOOK_Z = 2.0
"""Standard errors a closed loop's gain must clear at a look after which the trial could still
measure longer: a trial looks up to five times, and each look at one-sided 5% would let a
candidate no better through far more often than one time in twenty."""

LAST_LOOK_Z = 1.65
"""Standard errors at the last look (one-sided 5%): twice there refused two single-thread
instances of vision_cnn that led one instance of two threads by 10.3% over six paired
windows, asked 11.1% (`bench find` run 40), where every other run of that load kept them."""

# (config, its measured objective, the rate it was measured at, the rate to express it at)
Normalise = Callable[[Knobs, float, float, float], float]


@dataclass(frozen=True, slots=True)
class Window:
    config: Knobs
    objective: float
    rate_per_s: float


@dataclass(frozen=True, slots=True)
class Outcome:
    verdict: str  # "revert" | "accept" | "reject"
    candidate: float
    incumbent: float
    rate_per_s: float
    reason: str
    margin: float = math.nan
    """The relative gain the final comparison asked for."""

    def led_by_half_the_margin(self) -> bool:
        """Whether the candidate came out ahead by at least half of what it had to clear."""
        if not self.incumbent > 0 or math.isnan(self.margin):
            return False
        return (self.incumbent - self.candidate) / self.incumbent >= self.margin / 2


@dataclass
class Trial:
    incumbent: Knobs
    candidate: Knobs
    baseline: Sequence[Window]
    """The incumbent's last windows in this state, oldest first (none in a new state)."""
    interleave: bool
    margin: float
    predicted_gain: float = 0.0
    accept_below: float | None = None
    """A trial for the core budget (``rrl.agent.budget``): the candidate is kept unless it measures
    above this objective (violating the SLO) and, where the incumbent's baseline violates it
    too, worse than that baseline by the margin (``_for_budget``)."""
    keep_on_tie: bool = False
    """Kept unless it measures slower: a shorter batch timeout predicted no slower, or a
    configuration within the cores against an incumbent beyond them (``Policy._keeps_on_tie``)."""
    max_windows: int = 8
    """Windows a trial extended round by round may run at most."""
    by_pairs: bool = False
    """Decide an interleaved trial by paired differences (``_paired_verdict``): a closed loop's."""
    pair_noise: float = DEFAULT_PAIR_NOISE
    """The standard deviation of one paired difference (log objective) known in this state
    before the trial: its prior, pooled with the trial's own."""
    min_gain: float = 0.05
    """The least relative gain a paired verdict keeps a candidate for."""
    windows: list[Window] = field(default_factory=list)
    paired_differences: list[float] = field(default_factory=list)
    """The differences the last paired verdict read (``differences``)."""
    rounds: int = 0
    """Rounds added to the first schedule while the candidate led without clearing the margin."""

    def schedule(self) -> list[Knobs]:
        c, i = self.candidate, self.incumbent
        if self.interleave:
            return [c, i, c, *([i, c] * self.rounds)]
        return [c, c, *([c] * self.rounds)]

    def margin_for(self, candidate_windows: int, incumbent_windows: int) -> float:
        """The relative gain a difference of two means over these many windows must clear."""
        n_c, n_i = max(candidate_windows, 1), max(incumbent_windows, 1)
        return self.margin * math.sqrt((1.0 / n_c + 1.0 / n_i) / 2.0)

    def next_config(self) -> Knobs:
        return self.schedule()[min(len(self.windows), len(self.schedule()) - 1)]

    def record(
        self, config: Knobs, objective: float, rate: float, norm: Normalise
    ) -> Outcome | None:
        """One measured window of the trial; an outcome once the trial is decided."""
        if config != self.next_config():  # chosen before the trial began: not part of it
            return None
        self.windows.append(Window(config, objective, rate))
        if self.accept_below is not None:
            return self._for_budget(objective, rate)
        ours = [w for w in self.windows if w.config == self.candidate]
        before = self._before()
        if (revert := self._reverted(ours, before, norm)) is not None:
            return revert
        if len(self.windows) < len(self.schedule()):
            return None
        if self.by_pairs and self.interleave:
            return self._paired_verdict(norm)
        theirs = [w for w in self.windows if w.config == self.incumbent] + before
        if not theirs:  # no baseline and no incumbent window: nothing to compare with
            return Outcome("reject", ours[-1].objective, float("nan"), rate, "no incumbent window")
        cand, inc, common = self._compare(ours, theirs, norm)
        margin = self.margin_for(len(ours), len(theirs))
        tie = self.keep_on_tie and cand <= inc
        behind = self._behind_beside(ours, norm, tie, common)
        accepted = (tie or cand < inc * (1 - margin)) and not behind
        step = 2 if self.interleave else 1
        if not accepted and cand < inc and len(self.schedule()) + step <= self.max_windows:
            self.rounds += 1  # ahead, not yet by the margin: measure longer
            return None
        figures = (
            f"over {len(ours)} and {len(theirs)} windows at {common:.0f}/s (margin {margin:.0%})"
        )
        cleared = cand < inc * (1 - margin)
        return self._verdict(
            accepted, cleared, "by the margin", figures, (cand, inc, common), margin
        )

    def _reverted(
        self, ours: list[Window], before: list[Window], norm: Normalise
    ) -> Outcome | None:
        """The revert within one window: the candidate's first window worse than the baseline
        by the margin. Interleaved, the verdict waits for the incumbent's window beside it
        (the schedule's second, which runs the incumbent as a revert would, so a worse
        candidate still costs one window) and needs that window too beaten by the margin: the
        baseline was read before the candidate ran, and a machine that slowed in between made
        an equal candidate look worse (run 37: the incumbent read 14.7 ms a request before a
        trial and 21 ms a while after it, and the loss rested the search for 36 s)."""
        if len(ours) != 1 or not before:
            return None
        if len(self.windows) != (2 if self.interleave else 1):
            return None
        cand, inc, common = self._compare(ours, before, norm)
        if not cand > inc * (1 + self.margin):
            return None
        against = f"the incumbent's {inc:.2f}"
        if self.interleave:
            beside = [self.windows[-1]]
            cand, inc, common = self._compare(ours, beside, norm)
            if not cand > inc * (1 + self.margin):
                return None
            against += f" before it and {inc:.2f} beside it"
        return Outcome(
            "revert",
            cand,
            inc,
            common,
            f"{self.candidate} measured J {cand:.2f} against {against} at {common:.0f}/s: "
            "worse, reverted after one window",
        )

    def differences(self, norm: Normalise) -> tuple[list[float], float]:
        """Each candidate window's log objective less the mean log objective of the incumbent
        windows beside it in time (the baseline's last one before the first candidate window),
        all expressed at the trial's common rate; and that rate."""
        seq = [*self.baseline[-1:], *self.windows]
        common = sum(w.rate_per_s for w in seq) / len(seq)
        logs = [math.log(max(norm(w.config, w.objective, w.rate_per_s, common), 1e-9)) for w in seq]
        out = []
        for k, w in enumerate(seq):
            if w.config != self.candidate:
                continue
            beside = [
                logs[j]
                for j in (k - 1, k + 1)
                if 0 <= j < len(seq) and seq[j].config == self.incumbent
            ]
            if beside:
                out.append(logs[k] - sum(beside) / len(beside))
        return out, common

    def spread(self, diffs: Sequence[float]) -> float:
        """The standard deviation of one difference: the trial's own sample pooled with
        ``pair_noise`` as two degrees of freedom (two or three differences alone would make a
        lucky trial look certain)."""
        prior_dof = 2.0
        mean = sum(diffs) / len(diffs) if diffs else 0.0
        squares = sum((d - mean) ** 2 for d in diffs)
        dof = max(len(diffs) - 1, 0) + prior_dof
        return math.sqrt((squares + prior_dof * self.pair_noise**2) / dof)

    def _paired_verdict(self, norm: Normalise) -> Outcome | None:
        """A closed loop's verdict once the schedule is in: accept a mean gain beyond
        ``min_gain`` and beyond ``EARLY_LOOK_Z`` standard errors (``LAST_LOOK_Z`` at the last
        look the windows allow); a candidate ahead but not by that measures another round while
        windows are left; otherwise the incumbent stays."""
        diffs, common = self.differences(norm)
        self.paired_differences = diffs
        if not diffs:
            return Outcome("reject", math.nan, math.nan, common, "no incumbent window beside")
        gain = -sum(diffs) / len(diffs)  # log units: about the relative gain
        last = len(self.schedule()) + 2 > self.max_windows  # no round left after this look
        z = LAST_LOOK_Z if last else EARLY_LOOK_Z
        need = max(self.min_gain, z * self.spread(diffs) / math.sqrt(len(diffs)))
        tie = self.keep_on_tie and gain >= 0
        accepted = tie or gain > need
        if not accepted and gain > 0 and not last:
            self.rounds += 1  # ahead, not yet beyond the noise: measure longer
            return None
        ours = [w for w in self.windows if w.config == self.candidate]
        theirs = [w for w in self.windows if w.config == self.incumbent]
        cand, inc = _centre(ours, norm, common), _centre(theirs, norm, common)
        figures = (
            f"at {common:.0f}/s: {gain:+.1%} over {len(diffs)} paired windows, needed {need:.1%}"
        )
        return self._verdict(
            accepted, gain > need, "beyond the noise", figures, (cand, inc, common), need
        )

    def _verdict(
        self,
        accepted: bool,
        cleared: bool,
        short_of: str,
        figures: str,
        measured: tuple[float, float, float],
        margin: float,
    ) -> Outcome:
        """The trial's end: kept or not, and why. ``cleared``: the gain cleared what it had to
        (a candidate kept without that is kept on a tie); ``measured``: the
        candidate's and the incumbent's objectives and the common rate they were read at."""
        cand, inc, common = measured
        what = f"not better {short_of}: incumbent kept"
        if accepted:
            what = "better: kept" if cleared else "no slower, kept on a tie"
        return Outcome(
            "accept" if accepted else "reject",
            cand,
            inc,
            common,
            f"{self.candidate} J {cand:.2f} against {inc:.2f} {figures}: {what}",
            margin,
        )

    def _behind_beside(self, ours: list[Window], norm: Normalise, tie: bool, common: float) -> bool:
        """Whether the candidate is no faster (slower, for a tie) than the incumbent measured
        beside it, in the trial's own windows: then a lead over the incumbent's side came from
        the baseline's window, read before the trial, and a machine that was slower then (or
        faster now) is no gain; the trial measures another round, or keeps the incumbent.
        Read at the trial's ``common`` rate, whose normalisations the verdict already asked
        the model for (another rate would simulate them all again)."""
        beside = [w for w in self.windows if w.config == self.incumbent]
        if not self.interleave or not beside:
            return False
        cand, inc = _centre(ours, norm, common), _centre(beside, norm, common)
        return cand > inc if tie else cand >= inc

    def _before(self) -> list[Window]:
        """The baseline windows that join the incumbent's side. An interleaved trial measures
        the incumbent between its candidate's windows; its last two windows before the trial
        join them, so that the side's median has three windows at its first verdict: the
        median of two is their mean, and one slow window (one in a few half-second windows of a
        closed loop reads far slower) faked a gain for the candidate (rrl/README, "Where it
        stands"). The drift older windows may bring cannot keep
        a candidate: it must also beat the incumbent measured beside it (``_behind_beside``)."""
        return list(self.baseline[-2:] if self.interleave else self.baseline)

    def _for_budget(self, objective: float, rate: float) -> Outcome | None:
        """The yield's verdict on one more window: back at once when it measured beyond the
        SLO, unless the incumbent's baseline was beyond it too and no better by the margin (an
        incumbent on more threads than the cores, in a storm: run 44 sent a yield measured at
        J 478 back to four instances of two threads on two cores measured at 783, which then
        answered 18 a second); kept once its windows are in."""
        limit = self.accept_below
        assert limit is not None
        base = statistics.median(w.objective for w in self.baseline) if self.baseline else None
        bar = limit if base is None or base <= limit else base * (1.0 + self.margin)
        if objective > bar:
            why = f"{self.candidate} measured J {objective:.2f} beyond the SLO's {limit:.2f}"
            if bar > limit:
                why += f" and the incumbent's {base:.2f} by the margin ({self.margin:.0%})"
            return Outcome("revert", objective, math.nan, rate, f"{why}: reverted")
        if len(self.windows) < len(self.schedule()):
            return None
        if objective <= limit:
            why = f"{self.candidate} within the SLO (J {objective:.2f} <= {limit:.2f})"
        else:
            why = f"{self.candidate} beyond the SLO as the incumbent was, and no worse"
            why += f" (J {objective:.2f} against {base:.2f})"
        return Outcome("accept", objective, math.nan, rate, f"{why}: cores yielded")

    def _compare(
        self, ours: list[Window], theirs: list[Window], norm: Normalise
    ) -> tuple[float, float, float]:
        everything = ours + theirs
        common = sum(w.rate_per_s for w in everything) / len(everything)
        return _centre(ours, norm, common), _centre(theirs, norm, common), common


def _centre(windows: list[Window], norm: Normalise, common: float) -> float:
    """The median of ``windows``' objectives, each expressed at the ``common`` rate."""
    return statistics.median(norm(w.config, w.objective, w.rate_per_s, common) for w in windows)


@dataclass
class PairSpread:
    """The spread of one paired difference in a workload state (``Trial.by_pairs``), pooled
    over the state's last trials: each trial's squared deviations from its own mean, over its
    degrees of freedom."""

    trials: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=8))

    def add(self, diffs: Sequence[float]) -> None:
        if len(diffs) > 1:
            mean = sum(diffs) / len(diffs)
            self.trials.append((sum((d - mean) ** 2 for d in diffs), len(diffs) - 1))

    def noise(self) -> float:
        """The pooled standard deviation; ``DEFAULT_PAIR_NOISE`` before any trial."""
        squares = sum(sq for sq, _ in self.trials)
        dof = sum(n for _, n in self.trials)
        return math.sqrt(squares / dof) if dof else DEFAULT_PAIR_NOISE

    def clear(self) -> None:
        self.trials.clear()


MAD_TO_SD = 1.4826
"""The median absolute deviation of normal noise times this is its standard deviation."""


def relative_noise(values: Sequence[float], floor: float) -> float:
    """The relative spread of an incumbent's windows (the median absolute deviation as a
    standard deviation, over the median), at least ``floor`` (and ``floor`` itself before
    there are three)."""
    if len(values) < 3:
        return floor
    middle = statistics.median(values)
    if middle <= 0:
        return floor
    spread = MAD_TO_SD * statistics.median(abs(v - middle) for v in values)
    return max(floor, spread / middle)
