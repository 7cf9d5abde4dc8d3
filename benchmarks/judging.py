"""A target judged against the noise floor measured in the same run.

A benchmark's ratio (the agent against the best static configuration, say) is noise as much as
skill until it is set beside what the same thing measured twice reads: the floor, a ratio of
at least 1 (the larger of two repeats over the smaller). A figure is ``met`` only when it clears
its target even after the floor moves it the wrong way, ``missed`` when it misses even after
the floor moves it the right way, and otherwise ``unresolved``: the machine could not tell the
two apart in that run, and the results file says so rather than passing or failing.
"""

from __future__ import annotations


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
