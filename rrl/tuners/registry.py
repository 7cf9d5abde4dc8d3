"""Every tuner by name, all behind the same ask/tell interface (``rrl.tuners.ask_tell.Tuner``)."""

from __future__ import annotations

from rrl.tuners.adaptive import AdaptiveSettings, make_adaptive_rrl
from rrl.tuners.ask_tell import PerWorkload, StateTunerFactory, TuningProblem
from rrl.tuners.baselines.aimd import AIMD
from rrl.tuners.baselines.bayesopt import BayesOpt
from rrl.tuners.baselines.exhaustive import Exhaustive
from rrl.tuners.baselines.hill_climb import HillClimb
from rrl.tuners.baselines.inflight import InFlightHillClimb
from rrl.tuners.baselines.qlearning import QLearning
from rrl.tuners.baselines.random_search import RandomSearch
from rrl.tuners.baselines.static import StaticDefault
from rrl.tuners.region_rl import RRLSettings, make_rrl

_BASELINES: dict[str, StateTunerFactory] = {
    "static": StaticDefault,
    "exhaustive": Exhaustive,
    "random": RandomSearch,
    "bo": BayesOpt,
    "qlearning": QLearning,
    "hill-climb": HillClimb,
    "aimd": AIMD,
    "inflight": InFlightHillClimb,
}

TUNERS = ("rrl", "adaptive-rrl", *_BASELINES)

DESCRIPTIONS = {
    "rrl": "RRL: region-based Q-learning, radius delta",
    "adaptive-rrl": "adaptive RRL: coarse regions, then GP-EI inside the best regions",
    "static": "static default (TF Serving CPU guidance)",
    "exhaustive": "exhaustive search (the oracle)",
    "random": "random search",
    "bo": "Bayesian optimization (GP-EI) over the whole grid",
    "qlearning": "plain Q-learning (radius 0)",
    "hill-climb": "hill climbing in index space (Triton quick search)",
    "aimd": "AIMD on batch size (Clipper)",
    "inflight": "hill climbing of batches in flight (TF adaptive scheduler)",
}


def build_tuner(
    name: str,
    problem: TuningProblem,
    *,
    radius: float | None = None,
    warm_start: bool = True,
) -> PerWorkload:
    """A fresh tuner. ``radius`` overrides RRL's delta (and adaptive RRL's coarse delta)."""
    if name == "rrl":
        settings = RRLSettings(warm_start=warm_start)
        if radius is not None:
            settings = RRLSettings(radius=radius, warm_start=warm_start)
        return make_rrl(problem, settings)
    if name == "adaptive-rrl":
        adaptive = AdaptiveSettings(warm_start=warm_start)
        if radius is not None:
            adaptive = AdaptiveSettings(coarse_radius=radius, warm_start=warm_start)
        return make_adaptive_rrl(problem, adaptive)
    factory = _BASELINES.get(name)
    if factory is None:
        raise ValueError(f"unknown tuner {name!r}; known: {', '.join(TUNERS)}")
    return PerWorkload(name, problem, factory, warm_start=False)
