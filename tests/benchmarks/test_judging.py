"""Targets judged against the noise floor of their run: met or missed only where the floor
cannot move the figure across the target, unresolved otherwise (``benchmarks.judging``), and
``iotgw bench tuner``'s four targets read that way (``benchmarks.tuner.report.targets``)."""

from __future__ import annotations

from typing import Any

from benchmarks.judging import judge, judge_each
from benchmarks.tuner.report import targets


def test_a_figure_is_met_or_missed_only_beyond_the_floor() -> None:
    # At most 1.1, the same knobs twice 1.05x apart.
    assert judge(1.0, 1.1, 1.05, at_least=False) == "met"  # 1.05 after the floor: still <= 1.1
    assert judge(1.08, 1.1, 1.05, at_least=False).startswith("unresolved")
    assert judge(1.2, 1.1, 1.05, at_least=False) == "missed"  # 1.143 even the floor's way round
    # At least 0.95.
    assert judge(1.0, 0.95, 1.04, at_least=True) == "met"
    assert judge(0.97, 0.95, 1.04, at_least=True).startswith("unresolved")
    assert judge(0.8, 0.95, 1.04, at_least=True) == "missed"
    # A floor wider than the gap to the target resolves nothing near it.
    assert "1.250x" in judge(0.9, 1.1, 1.25, at_least=False)
    assert judge(None, 1.1, 1.05, at_least=False) == "missed: no figure"
    assert judge(1.0, 1.1, None, at_least=False) == "unresolved: no noise floor measured"


def summary(**figures: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "violations_vs_best_static": 1.0,
        "steady_p95_vs_best_static": 1.0,
        "p95_reduction_vs_default": 0.6,
        "settle_s": 5.0,
        "noise_floor": {"violations_ratio": 1.0, "steady_p95_ratio": 1.04, "p95_ratio": 1.02},
    }
    base.update(figures)
    return base


def test_the_tuner_bench_targets_are_judged_against_its_floor() -> None:
    assert targets(summary()) == {
        "violations_vs_best_static_at_most_1": "met",
        "steady_p95_vs_best_static_at_most_1.05": "met",  # 1.0 x 1.04 <= 1.05
        "p95_reduction_vs_default_at_least_0.5": "met",  # 0.4 x 1.02 <= 0.5
        "settle_s_at_most_10": "met",
    }
    # The same knobs twice 1.25-3.38x apart (the floor the issue measured): nothing resolves.
    noisy = targets(
        summary(
            steady_p95_vs_best_static=1.3,
            noise_floor={"violations_ratio": 2.0, "steady_p95_ratio": 1.6, "p95_ratio": 1.6},
        )
    )
    assert noisy["steady_p95_vs_best_static_at_most_1.05"].startswith("unresolved")
    assert noisy["violations_vs_best_static_at_most_1"].startswith("unresolved")
    assert noisy["p95_reduction_vs_default_at_least_0.5"].startswith("unresolved")
    assert noisy["settle_s_at_most_10"].startswith("unresolved: the same knobs' steady p95")
    # A clear miss stays a miss.
    bad = targets(summary(violations_vs_best_static=5.0, settle_s=40.0))
    assert bad["violations_vs_best_static_at_most_1"] == "missed"
    assert bad["settle_s_at_most_10"] == "missed"
    assert targets(summary(noise_floor=None))["settle_s_at_most_10"].startswith("unresolved")


def test_runs_are_judged_each_against_its_own_floor() -> None:
    """0.90 measured against a pair of statics 1% apart misses 0.95 whatever the noise; a
    wider floor beside another run (1.10) does not make it unresolved, as judging the worst
    figure against the widest floor did."""
    verdict, figure, floor = judge_each([(0.93, 1.10), (0.90, 1.01)], 0.95, at_least=True)
    assert (verdict, figure, floor) == ("missed", 0.90, 1.01)
    assert judge(0.90, 0.95, 1.10, at_least=True).startswith("unresolved")
    # Every run met after its own floor: met, reported at the worst run.
    assert judge_each([(1.00, 1.02), (0.98, 1.01)], 0.95, at_least=True) == ("met", 0.98, 1.01)
    # None missed, one unresolved: unresolved, decided by that run, not by the worst met one.
    verdict, figure, _ = judge_each([(1.06, 1.01), (1.04, 1.08)], 1.1, at_least=False)
    assert verdict.startswith("unresolved") and figure == 1.04
    assert judge_each([], 1.1, at_least=False) == ("missed: no figure", None, None)
