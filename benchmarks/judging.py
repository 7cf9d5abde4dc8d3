"""A target judged against the noise floor measured in the same run.

A benchmark's ratio (the agent against the best static configuration, say) is noise as much as
skill until it is set beside what the same thing measured twice reads: the floor, a ratio of
at least 1 (the larger of two repeats over the smaller). A figure is ``met`` only when it clears
its target even after the floor moves it the wrong way, ``missed`` when it misses even after
the floor moves it the right way, and otherwise ``unresolved``: the machine could not tell the
two apart in that run, and the results file says so rather than passing or failing.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence


def judge(value: float | None, target: float, floor: float | None, *, at_least: bool) -> str:
    """``value`` against ``target`` (``at_least``: the figure must reach it; else stay at or
    below it), given the run's ``floor``; "missed: no figure" when there is no figure,
    "unresolved: no noise floor measured" when there is no floor."""
    if value is None:
        return "missed: no figure"
    if floor is None:
        return "unresolved: no noise floor measured"
    f = max(floor, 1.0)
    low, high = value / f, value * f
    if at_least:
        met, missed = low >= target, high < target
    else:
        met, missed = high <= target, low > target
    if met:
        return "met"
    if missed:
        return "missed"
    return f"unresolved: within the noise floor ({f:.3f}x between the same knobs twice)"


def judge_each(
    figures: Sequence[tuple[float, float | None]], target: float, *, at_least: bool
) -> tuple[str, float | None, float | None]:
    """Many runs' figures, each with the floor of its own comparison, judged together: missed
    when any run missed even after its own floor, met when every run met after its own floor,
    else unresolved. Returns (verdict, the deciding figure, its floor): the worst missed run,
    else the worst unresolved one, else the worst run. A wide floor beside one comparison
    does not excuse another run measured against a tight one."""
    if not figures:
        return judge(None, target, None, at_least=at_least), None, None
    verdicts = [(judge(v, target, f, at_least=at_least), v, f) for v, f in figures]

    def worst(rows: list[tuple[str, float, float | None]]) -> tuple[str, float, float | None]:
        return (min if at_least else max)(rows, key=lambda row: row[1])

    for kind in ("missed", "unresolved"):
        of_kind = [row for row in verdicts if row[0].startswith(kind)]
        if of_kind:
            return worst(of_kind)
    return worst(verdicts)


def pair_floor(values: Sequence[float | None]) -> float | None:
    """What the same thing reads measured twice: the larger over the smaller of two
    consecutive values, median over the pairs (None: no two values)."""
    pairs = [
        max(a, b) / min(a, b)
        for a, b in itertools.pairwise(values)
        if a is not None and b is not None and min(a, b) > 0
    ]
    return round(statistics.median(pairs), 4) if pairs else None
