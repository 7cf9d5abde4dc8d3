"""The prediction gate: a candidate configuration is tried only when the queueing model
(``rrl.agent.queueing``) predicts it gains more over the incumbent than the prediction's
uncertainty.

For the incumbent i and a candidate c under the arrivals seen now, with predicted objectives
J(i), J(c) and standard deviations sd(i), sd(c):

    gain = J(i) - J(c)
    tried  iff  gain > kappa * sqrt(sd(i)^2 + sd(c)^2)  and  gain > min_gain * J(i)

``kappa`` (2) makes a try a bet the model is confident in; ``min_gain`` (5%, twice that for a
candidate that rebuilds sessions, whose switch costs a latency blip) leaves alone gains too small
to be worth a switch. Candidates: every
configuration of the grid the model can predict, screened with one trace each
(``screen``), the best few predicted again with ``replicas`` traces; the tuner's own proposal
(RRL with its profile priors) is always among them. A candidate predicted worse than the
incumbent at ``headroom`` (2) times the current rate is not tried (robust to the next burst).
The verdict says what was considered and why the best candidate was or was not tried, for the
decision log.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

from models.knobs import Knobs
from rrl.agent.queueing import Arrivals, Prediction, QueueModel


@dataclass(frozen=True, slots=True)
class GateSettings:
    kappa: float = 2.0
    min_gain: float = 0.05
    shortlist: int = 4
    headroom: float = 2.0
    """A candidate predicted worse than the incumbent at this many times the current rate is
    not tried: a switch must not trade a small gain now for a collapse at the next burst."""
    """Candidates predicted again with every replica after the one-trace screening."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the gate concluded: ``candidate`` None means the incumbent stays."""

    incumbent: Prediction | None
    best: Prediction | None
    """The candidate with the largest predicted gain (tried or not)."""
    candidate: Knobs | None
    gain: float
    uncertainty: float
    considered: int
    reason: str

    def as_dict(self) -> dict[str, object]:
        return {
            "tried": None if self.candidate is None else self.candidate.as_dict(),
            "incumbent": None if self.incumbent is None else self.incumbent.as_dict(),
            "best_candidate": None
            if self.best is None
            else {"config": self.best.config.as_dict(), **self.best.as_dict()},
            "gain": round(self.gain, 3),
            "uncertainty": round(self.uncertainty, 3),
            "considered": self.considered,
            "reason": self.reason,
        }


def screen(
    model: QueueModel,
    arrivals: Arrivals,
    configs: Iterable[Knobs],
    keep: int,
    kappa: float = 2.0,
    length: int = 200,
) -> list[Knobs]:
    """The ``keep`` configurations with the lowest pessimistic objective (predicted from one
    trace of ``length`` arrivals each, plus ``kappa`` standard deviations): a configuration
    predicted a hair better under threads never measured does not crowd out one the model
    knows."""
    scored = []
    configs = list(configs)
    asks = [(c, arrivals, 1) for c in configs]
    for config, p in zip(configs, model.predict_many(asks, length=length), strict=True):
        if p is not None:
            # Ties (at a trickle every eager configuration forms the same batches) go to the
            # larger max batch: it keeps up when a burst comes, batch 1 does not.
            c = config
            tie = (-c.max_batch_size, c.batch_timeout_ms, c.concurrency, c.intra_op_threads)
            scored.append((round(p.objective + kappa * p.sd, 6), tie, config))
    scored.sort(key=lambda x: (x[0], x[1]))
    return [c for _, _, c in scored[:keep]]


def decide(
    model: QueueModel,
    arrivals: Arrivals,
    incumbent: Knobs,
    candidates: Iterable[Knobs],
    settings: GateSettings | None = None,
) -> Verdict:
    """The gate's verdict for ``candidates`` (already screened) against ``incumbent``."""
    s = settings or GateSettings()
    if not model.calibrated:
        (inc,) = model.predict_many([(incumbent, arrivals, 1)])  # in the model's process
        reason = "the model's error is not proven yet (too few calibrated windows)"
        if inc is None:
            reason = "no service time measured yet"
        return Verdict(inc, None, None, 0.0, 0.0, 0, reason)
    others = [c for c in dict.fromkeys(candidates) if c != incumbent]  # unique, in order
    surge = replace(arrivals, rate_per_s=arrivals.rate_per_s * s.headroom)
    # Every prediction in one call: the model may run them in a process of its own.
    asks = [(c, a, r) for c in (incumbent, *others) for a, r in ((arrivals, None), (surge, 1))]
    predicted = model.predict_many(asks)
    inc, inc_surge = predicted[0], predicted[1]
    if inc is None:
        return Verdict(None, None, None, 0.0, 0.0, 0, "no service time measured yet")
    best: tuple[float, float, float, Prediction] | None = None
    considered = 0
    for i, config in enumerate(others):
        p, p_surge = predicted[2 + 2 * i], predicted[3 + 2 * i]
        if p is None:
            continue
        considered += 1
        if inc_surge is not None and s.headroom > 1:
            limit = inc_surge.objective * (1 + s.min_gain)
            if p_surge is None or p_surge.objective > limit:
                continue  # fragile: worse than the incumbent if the load rose
        gain = inc.objective - p.objective
        bound = s.kappa * math.hypot(inc.sd, p.sd)
        # A session rebuild costs a latency blip: it must earn twice the smallest gain.
        needed = s.min_gain * inc.objective * (2.0 if needs_rebuild(incumbent, config) else 1.0)
        # The best bet: the largest gain beyond its own uncertainty and the switch's cost.
        if best is None or gain - bound - needed > best[0] - best[1] - best[2]:
            best = (gain, bound, needed, p)
    if best is None:
        reason = "no candidate to compare"
        if considered:
            reason = (
                f"every candidate predicted worse than the incumbent at {s.headroom:g}x the rate"
            )
        return Verdict(inc, None, None, 0.0, 0.0, considered, reason)
    gain, bound, needed, p = best
    return _verdict(inc, p, gain, bound, needed, considered)


def _verdict(
    inc: Prediction, p: Prediction, gain: float, bound: float, needed: float, considered: int
) -> Verdict:
    """The best candidate is tried when its gain clears both its uncertainty and what a switch
    must earn; the reason says which held."""
    tried = gain > bound and gain > needed
    if tried:
        reason = (
            f"{p.config} predicted J {p.objective:.2f} against {inc.objective:.2f}: gain "
            f"{gain:.2f} clears its uncertainty {bound:.2f}"
        )
    elif gain <= needed and gain > bound:
        reason = (
            f"best candidate {p.config} predicted gain {gain:.2f} below the {needed:.2f} a "
            "switch must earn: not worth it"
        )
    else:
        reason = (
            f"best candidate {p.config} predicted gain {gain:.2f} within its uncertainty "
            f"{bound:.2f}: not tried"
        )
    return Verdict(inc, p, p.config if tried else None, gain, bound, considered, reason)


def needs_rebuild(old: Knobs, new: Knobs) -> bool:
    return (old.concurrency, old.intra_op_threads, old.inter_op_threads) != (
        new.concurrency,
        new.intra_op_threads,
        new.inter_op_threads,
    )
