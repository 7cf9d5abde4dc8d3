"""What ``iotgw bench find`` measures: the loads, the static grid, the agent's starts, the
durations, and the targets its summary is held against."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from models.knobs import Knobs

NAME = "tuner_find"
TARGET_THROUGHPUT = 0.95  # closed loop: agent / best static, at least
TARGET_P99 = 1.1  # open loop: agent / best static, at most
TARGET_SETTLE_S = 60.0
WITHIN = 0.05  # "within 5% of the best static" for the settle time


@dataclass(frozen=True, slots=True)
class Load:
    """A closed loop of ``level`` connections (wrk), or Poisson arrivals at ``level`` times the
    open loop's capacity measured at the start of the run (``iotgw sim``: the highest rate it
    and the gateway sustain together, ``measure.open_capacity``)."""

    kind: Literal["closed", "open"]
    level: float

    @property
    def name(self) -> str:
        return f"c{int(self.level)}" if self.kind == "closed" else f"open{self.level:g}"


@dataclass(frozen=True, slots=True)
class Start:
    """Where an agent run begins: ``knobs`` set by hand and the agent resumed on them (None:
    the shipped default, what ``iotgw serve`` starts from); ``path``: the loads of a user's
    sweep first (a burst of the other model, then each lower closed loop of this one)."""

    name: str
    knobs: Knobs | None = None
    path: bool = False


SWEEP_CONNECTIONS = (1, 8, 32, 128)
"""A user's sweep, the ``after_path`` start: each of these below the load (all of them before
an open loop), whichever loads the run measures."""

STARTS = (
    Start("default"),
    Start("batch1", Knobs(1, 0.0, 1, 1, 1)),
    Start("wide", Knobs(128, 8.0, 4, 2, 1)),
    Start("narrow", Knobs(2, 0.0, 2, 1, 1)),
    Start("after_path", path=True),
)


SPLITS = ((1, 1), (1, 2), (2, 1))
"""Instances x intra-op threads on two cores."""
BATCHES = (1, 4, 16, 32, 128)


def static_grid(
    max_batch: int,
    batches: tuple[int, ...] = BATCHES,
    splits: tuple[tuple[int, int], ...] = SPLITS,
) -> tuple[Knobs, ...]:
    """The static configurations screened: ``batches`` up to the model's largest, eager or a
    2 ms wait, and ``splits`` of the cores (inter-op 1)."""
    sizes = sorted({min(b, max_batch) for b in batches})
    return tuple(Knobs(b, t, c, i, 1) for b in sizes for t in (0.0, 2.0) for c, i in splits)


@dataclass(frozen=True, slots=True)
class Plan:
    models: tuple[str, ...]
    loads: tuple[Load, ...]
    starts: tuple[Start, ...]
    screen_at: tuple[int, ...]
    """Closed-loop connections the whole grid is measured at; the best ``finalists`` at each
    go on to every load (the pruning is itself a measurement, recorded in the results)."""
    finalists: int
    screen_s: float
    warmup_s: float
    run_s: float
    measured_s: float
    """The last seconds of an agent run, measured; the ones before are in ``slice_s`` slices
    for the settle time. A finalist's point at each load is measured as long: a p99 over 10 s
    of Poisson load rests on a few dozen requests and one congestion spell, so a shorter point
    than the agent's window widened the floor (the same knobs twice read 1.70x apart at 0.6 of
    capacity with 10 s points) and compared unlike figures."""
    slice_s: float
    probe_s: float
    """Each probe of the open loop's capacity (``measure.open_capacity``), after the warm-up."""
    path_step_s: float
    repeats: int
    """Agent runs per (load, start): the worst case is over all of them."""
    batches: tuple[int, ...] = BATCHES
    splits: tuple[tuple[int, int], ...] = SPLITS


FULL = Plan(
    models=("sensor_mlp", "vision_cnn"),
    loads=(
        Load("closed", 1),
        Load("closed", 8),
        Load("closed", 32),
        Load("closed", 128),
        Load("open", 0.3),
        Load("open", 0.6),
        Load("open", 0.9),
    ),
    starts=STARTS,
    screen_at=(1, 32),
    finalists=3,
    screen_s=5.0,
    warmup_s=2.0,
    run_s=90.0,
    measured_s=30.0,
    slice_s=10.0,
    probe_s=8.0,
    path_step_s=15.0,
    repeats=1,
)

QUICK = Plan(
    models=("sensor_mlp",),
    loads=(Load("closed", 8), Load("open", 0.5)),
    starts=(Start("default"), Start("batch1", Knobs(1, 0.0, 1, 1, 1))),
    screen_at=(8,),
    finalists=1,
    screen_s=1.0,
    warmup_s=0.5,
    run_s=6.0,
    measured_s=2.0,
    slice_s=2.0,
    probe_s=1.0,
    path_step_s=1.0,
    repeats=1,
    batches=(1, 32),
    splits=((1, 1), (2, 1)),
)
