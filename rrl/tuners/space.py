"""The configuration space: the five parallelism knobs on a grid, in index coordinates.

Index coordinates: batch size and batch timeout on a log2 scale (the timeout with 0 as its own
first notch), concurrency and threads linear, so one step of 1 along any axis means "one notch"
(a doubling, or one more thread) and a Euclidean distance in index space means the same on every
axis. The full grid has every notch; a coarser grid (a documented subset) may skip some. The
machine's limits are applied when the space is built (``ConfigSpace.for_machine``): threads up
to the cores, concurrency up to twice the cores.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from models.knobs import Knobs


@dataclass(frozen=True)
class ConfigSpace:
    """A grid of configurations. Configurations are numbered in row-major order of the axes
    (``flat`` indices); ``coords`` holds each one's index coordinates."""

    batch_sizes: tuple[int, ...]
    timeouts_ms: tuple[float, ...]
    concurrency: tuple[int, ...]
    intra_op_threads: tuple[int, ...]
    inter_op_threads: tuple[int, ...]

    def __post_init__(self) -> None:
        for name in ("batch_sizes", "concurrency", "intra_op_threads", "inter_op_threads"):
            axis = getattr(self, name)
            if not axis or axis[0] < 1 or any(b <= a for a, b in itertools.pairwise(axis)):
                raise ValueError(f"{name} must be increasing integers from 1 up, got {axis}")
        if any(not _is_power_of_two(b) for b in self.batch_sizes):
            raise ValueError(f"batch_sizes must be powers of two, got {self.batch_sizes}")
        t = self.timeouts_ms
        if not t or t[0] != 0 or any(b <= a for a, b in itertools.pairwise(t)):
            raise ValueError(f"timeouts_ms must start with 0 and increase, got {t}")
        if any(not _is_power_of_two(v / t[1]) for v in t[1:]):
            raise ValueError(f"positive timeouts must be the first one times powers of two: {t}")

    @classmethod
    def for_machine(
        cls,
        cores: int,
        *,
        max_batch_size: int = 128,
        max_timeout_ms: float = 8.0,
        max_concurrency: int | None = None,
        max_inter_op_threads: int | None = None,
    ) -> ConfigSpace:
        """The full grid on a machine with ``cores`` cores: batch sizes 1, 2, 4, ... up to
        ``max_batch_size``; timeouts 0, 1, 2, 4, ... ms up to ``max_timeout_ms``; intra-op and
        inter-op threads 1..cores (more threads than cores only time-slice); concurrency
        1..2*cores (one batch computing per core while another is being formed)."""
        if cores < 1:
            raise ValueError("cores must be at least 1")
        batches = tuple(2**i for i in range(int(math.log2(max_batch_size)) + 1))
        timeouts: list[float] = [0.0]
        t = 1.0
        while t <= max_timeout_ms:
            timeouts.append(t)
            t *= 2
        conc = max_concurrency if max_concurrency is not None else 2 * cores
        inter = max_inter_op_threads if max_inter_op_threads is not None else cores
        return cls(
            batch_sizes=batches,
            timeouts_ms=tuple(timeouts),
            concurrency=tuple(range(1, conc + 1)),
            intra_op_threads=tuple(range(1, cores + 1)),
            inter_op_threads=tuple(range(1, inter + 1)),
        )

    @property
    def axes(self) -> tuple[tuple[float, ...], ...]:
        return (
            tuple(float(b) for b in self.batch_sizes),
            self.timeouts_ms,
            tuple(float(c) for c in self.concurrency),
            tuple(float(t) for t in self.intra_op_threads),
            tuple(float(t) for t in self.inter_op_threads),
        )

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(len(axis) for axis in self.axes)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @cached_property
    def configs(self) -> tuple[Knobs, ...]:
        return tuple(
            Knobs(int(b), float(t), int(c), int(i), int(o))
            for b, t, c, i, o in itertools.product(*self.axes)
        )

    @cached_property
    def axis_coords(self) -> tuple[np.ndarray, ...]:
        """Index coordinate of every value of every axis: log2 of the batch size; 0 for timeout
        0 and 1 + log2(t / smallest positive timeout) otherwise; value - 1 for concurrency and
        threads. On the full grid these are the positions 0, 1, 2, ...; on a coarser grid one
        step may span several notches, and distances stay in notches."""
        t = self.timeouts_ms
        timeout = [0.0] + [1.0 + math.log2(v / t[1]) for v in t[1:]]
        return (
            np.log2(np.array(self.batch_sizes, dtype=np.float64)),
            np.array(timeout),
            np.array(self.concurrency, dtype=np.float64) - 1,
            np.array(self.intra_op_threads, dtype=np.float64) - 1,
            np.array(self.inter_op_threads, dtype=np.float64) - 1,
        )

    @cached_property
    def coords(self) -> np.ndarray:
        """(size, 5) index coordinates, float64, in flat order."""
        grids = np.meshgrid(*self.axis_coords, indexing="ij")
        return np.stack([g.ravel() for g in grids], axis=1)

    @cached_property
    def distances(self) -> np.ndarray:
        """(size, size) Euclidean distances in index space (a few MB for the full grid)."""
        diff = self.coords[:, None, :] - self.coords[None, :, :]
        return np.sqrt((diff**2).sum(axis=2))

    @cached_property
    def _flat_of(self) -> dict[Knobs, int]:
        return {c: i for i, c in enumerate(self.configs)}

    def __iter__(self) -> Iterator[Knobs]:
        return iter(self.configs)

    def __len__(self) -> int:
        return self.size

    def __contains__(self, config: object) -> bool:
        return config in self._flat_of

    def flat(self, config: Knobs) -> int:
        """The flat index of a configuration on the grid (``snap`` one that is not)."""
        try:
            return self._flat_of[config]
        except KeyError:
            raise KeyError(f"{config} is not on the grid; snap() it first") from None

    def coord(self, config: Knobs) -> np.ndarray:
        return self.coords[self.flat(config)]

    def snap(self, config: Knobs) -> Knobs:
        """The nearest grid configuration, axis by axis (log2 scale for batch and timeout), so
        a gateway started with off-grid knobs can still be described in this space."""
        b = _nearest_log(self.batch_sizes, config.max_batch_size)
        t = (
            self.timeouts_ms[0]
            if config.batch_timeout_ms <= 0 or len(self.timeouts_ms) == 1
            else _nearest_timeout(self.timeouts_ms, config.batch_timeout_ms)
        )
        return Knobs(
            int(b),
            float(t),
            _clamp(self.concurrency, config.concurrency),
            _clamp(self.intra_op_threads, config.intra_op_threads),
            _clamp(self.inter_op_threads, config.inter_op_threads),
        )

    def at(self, flat: int) -> Knobs:
        return self.configs[flat]

    def at_coord(self, coord: Sequence[float] | np.ndarray) -> Knobs:
        """The grid configuration nearest to ``coord``, axis by axis."""
        positions = tuple(
            int(np.argmin(np.abs(axis - float(x))))
            for axis, x in zip(self.axis_coords, coord, strict=True)
        )
        return self.configs[int(np.ravel_multi_index(positions, self.shape))]

    def ball(self, center: int, radius: float) -> np.ndarray:
        """Flat indices of every configuration within ``radius`` of ``center`` (itself included)."""
        return np.flatnonzero(self.distances[center] <= radius + 1e-9)

    def describe(self) -> dict[str, list[float] | list[int]]:
        return {
            "max_batch_size": list(self.batch_sizes),
            "batch_timeout_ms": list(self.timeouts_ms),
            "concurrency": list(self.concurrency),
            "intra_op_threads": list(self.intra_op_threads),
            "inter_op_threads": list(self.inter_op_threads),
        }

    @classmethod
    def from_description(cls, doc: dict[str, Sequence[float]]) -> ConfigSpace:
        return cls(
            batch_sizes=tuple(int(v) for v in doc["max_batch_size"]),
            timeouts_ms=tuple(float(v) for v in doc["batch_timeout_ms"]),
            concurrency=tuple(int(v) for v in doc["concurrency"]),
            intra_op_threads=tuple(int(v) for v in doc["intra_op_threads"]),
            inter_op_threads=tuple(int(v) for v in doc["inter_op_threads"]),
        )


def tf_serving_default(space: ConfigSpace, cores: int) -> Knobs:
    """TF Serving's CPU guidance, snapped to the grid: threads = cores (intra and inter), batch
    threads (concurrency) = cores, a large maximum batch, batch timeout 0."""
    return space.snap(Knobs(space.batch_sizes[-1], 0.0, cores, cores, cores))


def _is_power_of_two(x: float) -> bool:
    return x > 0 and math.isclose(2.0 ** round(math.log2(x)), x)


def _nearest_log(values: Sequence[float], x: float) -> float:
    target = math.log2(max(x, 1e-9))
    return min(values, key=lambda v: abs(math.log2(v) - target))


def _nearest_timeout(values: Sequence[float], x: float) -> float:
    # On the index scale 0 sits one notch below the smallest positive timeout t1, so x maps to
    # index 1 + log2(x / t1) and anything nearer to index 0 than to index 1 is 0.
    first = values[1]
    if 1.0 + math.log2(x / first) < 0.5:
        return values[0]
    return _nearest_log(values[1:], x)


def _clamp(axis: Sequence[int], x: int) -> int:
    return int(min(max(x, axis[0]), axis[-1]))


EXPERT_BATCH_CAP = 32
"""The expert default's largest batch when the model allows more: eager batching only reaches
it under a backlog, and a larger batch there makes its first requests wait for the whole batch."""


def core_share(cores: int, models: int) -> int:
    """The cores each of ``models`` tuned models starts from: an equal share, at least one.
    Every model sized to all the cores would start several of them oversubscribed (two models
    at 1 x 2 threads on 2 cores), and the joint core budget moves cores to a model only when
    another one asks; the gateway's agents and the bench's expert arm both start here."""
    return max(1, cores // max(models, 1))


def expert_default(cores: int, max_batch_size: int) -> Knobs:
    """What a practitioner would configure without measuring: eager batching (timeout 0, so a
    free instance takes whatever is queued, up to the max batch: batch 1 at a trickle, large in
    a burst; Triton's dynamic batcher does not delay either), and instances sized to the cores
    so that concurrency x intra-op threads <= cores, one inter-op thread (these graphs are
    chains).

    One instance per two cores, up to 4, the rest as intra-op threads: the gateway's event loop
    (decoding, batching, every reply) is one more busy thread, and a second instance on a small
    box takes its core (the measurements behind it: rrl/README.md, "The online agent")."""
    if cores < 1 or max_batch_size < 1:
        raise ValueError("cores and max_batch_size must be at least 1")
    concurrency = max(1, min(cores // 2, 4))
    return Knobs(
        max_batch_size=2 ** int(math.log2(min(max_batch_size, EXPERT_BATCH_CAP))),
        batch_timeout_ms=0.0,
        concurrency=concurrency,
        intra_op_threads=max(1, cores // concurrency),
        inter_op_threads=1,
    )
