"""What the agent knows from measurement alone, and when that overrules the queueing model.

- **Model trust** (``ModelTrust``): the model predicts the incumbent's objective with a stated
  uncertainty (``kappa`` standard deviations) before each of its windows. When the measured
  objective lands outside that band in ``misses`` of the last ``judged`` windows, the model's
  predictions have been wrong where they can be checked, so they may no longer veto a
  candidate: candidates are then tried on measurement. A model that comes back within its band
  for ``judged`` windows running is trusted again.
- **Closed-loop load** (``LoadKind``): a closed loop (N clients, each sending its next request
  when the last is answered) keeps the number of requests inside the gateway nearly constant
  and never zero; the arrival rate follows the service rate. An open-loop (Poisson) load of the
  same mean sees that number come and go. Fed one reading per tick, ``closed`` says which, and
  ``population`` how many requests a closed loop keeps in. A loop read as closed stays closed
  through dips (readings below its population: replies in transit) and leaves only on what an
  open loop shows and a closed one cannot: an empty model, more requests inside than the loop
  holds, a median far below it, or a refusal.
- **The closed-loop simulation's band** (``ClosedLoopBand``): in a closed loop, every measured
  window's time per request (Little's law) against what the closed-loop simulation predicted
  for its configuration, per configuration measured in the workload state. Once a few
  configurations were measured, a neighbour the simulation puts slower than the incumbent
  measured, even at the most favourable ratio it has shown (the configuration it was most
  pessimistic about), cannot win a trial: the search rests instead of measuring it. Each miss
  in that direction widens the band, so a simulation that has been wrong in a neighbour's
  favour loses its veto by itself. The band is kept per kind of configuration: per kind of
  batching (eager, or with a timeout: the simulation under-predicts eager batches, and that
  error says nothing about how wrong it is about timeouts) and per split of the cores
  (instances, threads each: the event loop's share of the cores, which the simulation does
  not see, differs between splits).
- **The measured neighbourhood** (``neighbours``): the configurations one notch from the
  incumbent on each axis, the same cores split the other way (instances and threads swapped),
  plus the corners that matter on a small box (the largest batch with
  all the cores in one instance's threads, and with one thread per core-sized instance). These
  are what the agent measures before it rests: it rests on trials that showed no gain, not on a
  prediction.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from models.knobs import Knobs
from rrl.tuners.space import ConfigSpace


@dataclass(frozen=True, slots=True)
class Miss:
    """One incumbent window judged against the prediction made for it."""

    predicted: float
    measured: float
    bound: float
    """The prediction's stated uncertainty (``kappa`` standard deviations)."""

    @property
    def missed(self) -> bool:
        return abs(self.measured - self.predicted) > self.bound

    def describe(self) -> str:
        return (
            f"the model predicted the incumbent at J {self.predicted:.2f} +- {self.bound:.2f} "
            f"and measured {self.measured:.2f}"
        )


@dataclass
class ModelTrust:
    """Whether the queueing model's predictions may veto what a measurement would show."""

    kappa: float = 2.0
    judged: int = 3
    misses: int = 2
    _recent: deque[Miss] = field(default_factory=deque)
    _trusted: bool = True

    def judge(self, predicted: float, sd: float, measured: float) -> Miss:
        """Record one incumbent window's measured objective against its prediction."""
        miss = Miss(predicted, measured, self.kappa * max(sd, 1e-9))
        self._recent.append(miss)
        while len(self._recent) > self.judged:
            self._recent.popleft()
        missed = sum(m.missed for m in self._recent)
        if missed >= self.misses:
            self._trusted = False
        elif len(self._recent) == self.judged and missed == 0:
            self._trusted = True
        return miss

    @property
    def trusted(self) -> bool:
        return self._trusted

    def last_miss(self) -> Miss | None:
        """The most recent window the model missed, for the decision log."""
        return next((m for m in reversed(self._recent) if m.missed), None)

    def reset(self) -> None:
        """A new workload state: what the model missed under the old one says nothing here."""
        self._recent.clear()
        self._trusted = True


@dataclass
class LoadKind:
    """Closed or open loop, from the most requests inside the model at once in each tick
    (``WindowStats.in_system_peak``).

    A closed loop of N clients reaches N inside in every tick in which all of them were in at
    once, and never more: its readings are one number. An open loop's peak moves with its
    bursts (a count taken at one instant would not do: a closed loop whose one batch empties
    the model reads anywhere from 1 to N). Sixteen readings, three quarters of them on the
    largest, tell the narrowest open loop measured from a closed one (the readings are in
    rrl/README, "Measured evidence before the model")."""

    readings: int = 16
    exact: float = 0.75
    """A loop begins when at least this share of the last ``readings`` are its population
    exactly (the rest may dip: a client that shares the cores holds a few replies now and
    then) and none is above it."""
    _seen: deque[int] = field(default_factory=deque)

    held: int | None = None
    """The closed loop's population the workload state is held for (``hold``), kept through a
    spell of mixed readings: a loop of another size after it is still another loop."""

    near: float = 0.1
    """A closed loop read keeps at least half of its readings within this fraction of its
    population (the rest may dip)."""
    _loop: int | None = None
    """The population of the closed loop read, while it is read as one."""
    least_new: int = 4
    """The smallest loop that is a new workload at the rate level of another (``another_loop``)."""
    strays: int = 4
    """Readings above a loop's population (of the last ``readings``) it outlives, and one a
    loop may begin through: a client that restarts (a load tool's next run, a device that
    reconnects) sends its next requests while the gateway still answers the ones the old
    connections left inside, so one tick reads up to twice the loop (measured: every restart
    of wrk's 32 connections read 40 to 64 once, and a rebuild's tick 41), and the loop read as
    lost at each made the agent take a closed loop for an open one. More than a quarter above
    it is another load (a loop grown to 64 is lost within five readings, then read anew)."""

    _storm: int | None = None
    """The population a load that refuses in most ticks is read at, while it does (``_storm_``
    methods), fixed from the tick it was first read."""
    _turned: bool = False
    """A storm began or ended since ``turned`` was last asked."""
    _ticks: deque[tuple[int, bool]] = field(default_factory=deque)
    """The last ``readings`` ticks: each one's reading (refusing or not), and whether it refused."""

    def observe(self, peak_inside: int, refused: int = 0) -> None:
        """One tick's reading of the most requests inside the model at once, and the requests
        refused since the last. A tick with refusals starts the readings over: an overloaded
        open loop keeps a full queue as steady as a closed loop keeps its clients, so a loop is
        never first read from refusing ticks. A loop already read is judged by its readings
        alone, refusals or not: its clients were refused for their deadline (admission's
        refusal of a request its batch would answer late) and send again, still the same
        clients, and a client's restart refuses the requests its old connections left inside
        as it reads above the loop; read as open after each such tick, its trials would value
        one window by p95 and the next by time per request (rrl/README, "Where it stands").
        A load that refuses in most ticks with no loop read is a storm (``_storm_goes_on``)."""
        self._ticks.append((peak_inside, refused > 0))
        while len(self._ticks) > self.readings:
            self._ticks.popleft()
        if self._loop is None and self._storm_goes_on():
            return
        if refused > 0 and self._loop is None:
            self._seen.clear()
            return
        self._seen.append(peak_inside)
        while len(self._seen) > self.readings:
            self._seen.popleft()
        if (population := self._begins()) is not None:
            self._loop = population
        elif self._loop is not None and not self._still_the_loop(self._loop):
            self._loop = None
        if self.closed and self.held is None:
            self.held = self.population

    def _storm_goes_on(self) -> bool:
        """Whether a storm is read this tick: begun, or going on. A load refused in at least
        ``exact`` of the last ``readings`` ticks, never empty, is read as a closed loop of the
        most requests those ticks held, fixed while it lasts, whatever its kind: a closed loop
        beyond its deadlines (wrk's 128 connections to vision_cnn: 1,600 to 3,800 refusals a
        second, each client sending again at once, so no tick reads the same count twice) and
        an open loop beyond the capacity are both served best by the configuration that
        answers the most requests a second, which time per request ``N / X`` at one fixed N
        ranks, where the p95 of the few answered reads the deadline on every configuration
        and the share refused reads how fast each refuses. It ends when fewer than half of the
        last ``readings`` ticks refused, and the readings start over (rrl/README, "Measured
        evidence before the model")."""
        ticks = len(self._ticks)
        refusing = sum(refused for _, refused in self._ticks)
        if self._storm is not None:
            if 2 * refusing >= ticks:
                return True
            self._storm, self._turned = None, True
            self._seen.clear()
            return False
        peaks = [peak for peak, _ in self._ticks]
        if ticks >= self.readings and refusing >= self.exact * ticks and min(peaks) >= 1:
            self._storm, self._turned = max(peaks), True
            self._seen.clear()
            if self.held is None:
                self.held = self._storm
            return True
        return False

    def turned(self) -> bool:
        """Whether a storm began or ended since last asked: a new workload state, since its
        windows are valued otherwise (``Policy.value_of``) and a trial or a baseline that
        straddles the turn would compare two kinds of figure."""
        turned, self._turned = self._turned, False
        return turned

    @property
    def storm(self) -> bool:
        """Whether the load is read as a storm of refusals (``_storm_goes_on``)."""
        return self._storm is not None

    def _begins(self) -> int | None:
        """A full set of readings, at least ``exact`` of them on the largest but one: a loop
        of that many begins (its population; None when none does)."""
        seen = self._seen
        if len(seen) < self.readings or min(seen) < 1:
            return None
        ordered = sorted(seen)
        top = ordered[-2] if self._strays_of(ordered[-2]) else ordered[-1]
        return top if sum(r == top for r in seen) >= self.exact * len(seen) else None

    def _still_the_loop(self, population: int) -> bool:
        """Whether the readings still fit a closed loop of ``population``: never empty, at
        most ``strays`` of them above what it holds, at least half of them near it."""
        seen = self._seen
        near = sum(r >= (1.0 - self.near) * population for r in seen)
        above = self._above(population, seen)
        return min(seen) >= 1 and above <= self._strays_of(population) and 2 * near >= len(seen)

    def _strays_of(self, population: int) -> int:
        """Readings above ``population`` a loop of it outlives: none below ``least_new``, where
        an open trickle's peaks of 1 to 3 would read as a loop through its rarer highs."""
        return self.strays if population >= self.least_new else 0

    @staticmethod
    def _above(population: int, seen: deque[int]) -> int:
        return sum(r > population for r in seen)

    @property
    def closed(self) -> bool:
        return self._loop is not None or self._storm is not None

    @property
    def population(self) -> int:
        """Requests a closed loop keeps inside (a storm: the most it held when first read); in
        an open loop, the largest recent reading."""
        if self._storm is not None:
            return self._storm
        return self._loop if self._loop is not None else max(self._seen, default=0)

    def hold(self) -> None:
        """A new workload state: held for the loop running now, if any."""
        self.held = self.population if self.closed else None

    def same_loop(self) -> bool:
        """Whether the load is still the closed loop the workload state was held for: its rate
        follows the configuration (a faster one answers the same clients more often), so a new
        rate level is not a new workload, and moving to one would drop a trial and start the
        search over. A loop of another size is a new workload."""
        if self.held is None or not self.closed:
            return False
        return abs(self.population - self.held) <= max(1, self.held // 4)

    def another_loop(self) -> bool:
        """Whether a closed loop at least twice or half the size of the one the workload state
        was held for runs now (a user's sweep from 8 connections to 32): a new workload, even at
        the same rate level (the loop of 32 answers 1.4x the loop of 8 on a small model). Loops
        of fewer than ``least_new`` do not count: a trickle's readings of 1, 2 or 3 inside at
        most are an open loop's as often as a loop's."""
        if self.held is None or not self.closed or self.population < self.least_new:
            return False
        return max(self.population, self.held) >= 2 * min(self.population, self.held)

    def per_request_ms(self, throughput_per_s: float) -> float | None:
        """A closed loop's time per request, N / X (Little's law: N requests always in, X
        answered per second), read from the count of answers, which a window measures far more
        closely than its p95; None in an open loop."""
        if not self.closed or throughput_per_s <= 0:
            return None
        return 1000.0 * self.population / throughput_per_s

    def window_requests(self, least: int) -> int:
        """Requests a window must hold: in a closed loop of N, ten rounds of the N (a window of
        a few batches reads their quantisation, not the configuration)."""
        return max(least, 10 * self.population) if self.closed else least

    def reset(self) -> None:
        self._seen.clear()
        self._loop = None
        self._storm = None
        self._ticks.clear()


@dataclass
class ClosedLoopBand:
    """How far the closed-loop simulation's time per request has been from the measured one,
    per configuration measured in this workload state (``measured / predicted``, each
    configuration's median over its windows: one noisy window does not make a band), judged
    per kind of configuration (``_kind``): its error on one kind shows nothing of another."""

    least: int = 3
    """Configurations measured before the band may rule a neighbour out: fewer do not show
    how wrong the simulation can be."""
    windows: int = 6
    _seen: dict[Knobs, deque[tuple[float, float]]] = field(default_factory=dict)
    """Per configuration, its last windows as (measured / predicted, measured ms)."""

    def observe(self, config: Knobs, predicted_ms: float, measured_ms: float) -> None:
        if not (predicted_ms > 0 and measured_ms > 0):
            return
        seen = self._seen.setdefault(config, deque(maxlen=self.windows))
        seen.append((measured_ms / predicted_ms, measured_ms))

    @property
    def configurations(self) -> int:
        return len(self._seen)

    def lowest_ratio(self, like: Knobs | None = None) -> float | None:
        """The most favourable ratio shown (the simulation's largest overestimate), None
        before ``least`` configurations were measured; with ``like``, over the configurations
        of its kind (``_kind``) only."""
        seen = [w for c, w in self._seen.items() if like is None or _kind(c) == _kind(like)]
        if len(seen) < self.least:
            return None
        return min(statistics.median(r for r, _ in w) for w in seen)

    def configurations_like(self, like: Knobs) -> int:
        """Configurations of ``like``'s kind (``_kind``) measured in this state."""
        return sum(_kind(c) == _kind(like) for c in self._seen)

    def measured_ms(self, config: Knobs) -> float | None:
        """The median measured time per request of ``config`` in this state, if measured."""
        seen = self._seen.get(config)
        return statistics.median(ms for _, ms in seen) if seen else None

    def rules_out(
        self, candidate: Knobs, predicted_ms: float, incumbent: Knobs, margin: float
    ) -> bool:
        """Whether ``candidate``, predicted at ``predicted_ms``, cannot beat ``incumbent``'s
        measured time by ``margin`` even at the most favourable ratio shown for its kind."""
        lowest, mine = self.lowest_ratio(candidate), self.measured_ms(incumbent)
        if lowest is None or mine is None:
            return False
        return predicted_ms * lowest >= mine * (1.0 - margin)

    def reset(self) -> None:
        """A new workload state (another loop): the band is learned again."""
        self._seen.clear()


def _kind(config: Knobs) -> tuple[bool, int, int]:
    """What the closed-loop simulation's error depends on: the kind of batching (eager, or
    with a timeout: it under-predicts eager batches) and the split of the cores (instances,
    intra-op threads each). The simulation runs a split's measured batch service times behind
    the event loop's cost per request as measured, and what a split changes most is the
    loop's share of the cores: with one instance's two threads on both cores the loop decodes
    only when a core is free (rrl/README has the run that showed it)."""
    return config.batch_timeout_ms <= 0, config.concurrency, config.intra_op_threads


AXES = ("max_batch_size", "batch_timeout_ms", "concurrency", "intra_op_threads")


def _axis_values(space: ConfigSpace, name: str) -> Sequence[float]:
    return {
        "max_batch_size": space.batch_sizes,
        "batch_timeout_ms": space.timeouts_ms,
        "concurrency": space.concurrency,
        "intra_op_threads": space.intra_op_threads,
    }[name]


def beyond(space: ConfigSpace, incumbent: Knobs, lead: Knobs, cores: int) -> Knobs | None:
    """One notch further than ``lead`` in the direction it differs from ``incumbent`` (on one
    axis only), within the cores: where a trial's candidate led without clearing the margin,
    the gain may grow further along the same axis (a batch timeout that balances a closed
    loop's clients over the instances is two notches from eager batching). None when they
    differ on another number of axes, or the axis ends."""
    moved = [a for a in AXES if getattr(lead, a) != getattr(incumbent, a)]
    if len(moved) != 1:
        return None
    (name,) = moved
    axis = _axis_values(space, name)
    at = min(range(len(axis)), key=lambda i: abs(axis[i] - getattr(lead, name)))
    was = min(range(len(axis)), key=lambda i: abs(axis[i] - getattr(incumbent, name)))
    step = 1 if at > was else -1
    if not 0 <= at + step < len(axis):
        return None
    further = space.snap(lead.with_changes({name: axis[at + step]}))
    if further.concurrency * further.intra_op_threads > cores:
        return None
    return further


def neighbours(space: ConfigSpace, incumbent: Knobs, cores: int) -> list[Knobs]:
    """One notch from ``incumbent`` on each axis (inter-op threads kept: the served graphs are
    chains), its instances and intra-op threads swapped, then the corners: the largest batch
    with every core in one instance's intra-op threads, and with one single-thread instance
    per core. On the grid, within the cores (instances x intra-op threads), nearest first, the
    incumbent left out."""
    found: list[Knobs] = []
    for name in AXES:
        axis = _axis_values(space, name)
        value = getattr(incumbent, name)
        at = min(range(len(axis)), key=lambda i: abs(axis[i] - value))
        for step in (-1, 1):
            if 0 <= at + step < len(axis):
                found.append(incumbent.with_changes({name: axis[at + step]}))
    # Instances and threads swapped (2 x 1 <-> 1 x 2): the same cores, split the other way,
    # which one notch on each axis cannot reach while both steps alone oversubscribe or idle.
    found.append(
        incumbent.with_changes(
            {"concurrency": incumbent.intra_op_threads, "intra_op_threads": incumbent.concurrency}
        )
    )
    largest = space.batch_sizes[-1]
    top = max(t for t in space.intra_op_threads if t <= cores)
    wide = max(c for c in space.concurrency if c <= cores)
    found.append(incumbent.with_changes({"max_batch_size": largest, "concurrency": 1}))
    found[-1] = found[-1].with_changes({"intra_op_threads": top})
    found.append(
        incumbent.with_changes(
            {"max_batch_size": largest, "concurrency": wide, "intra_op_threads": 1}
        )
    )
    out: list[Knobs] = []
    for config in found:
        snapped = space.snap(config)
        within = snapped.concurrency * snapped.intra_op_threads <= cores
        if snapped != incumbent and within and snapped not in out:
            out.append(snapped)
    return out
