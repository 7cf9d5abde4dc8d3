"""The online agent's settings (``rrl.agent.model_agent``, ``rrl.agent.policy``): one frozen
dataclass, a docstring per field where the name does not say it all."""

from __future__ import annotations

from dataclasses import dataclass, field

from models.knobs import Knobs
from rrl.agent.gate import GateSettings
from rrl.agent.queueing import QueueModelSettings
from rrl.tuners.workload import MonitorSettings


@dataclass(frozen=True, slots=True)
class RestSettings:
    """When the agent rests and what wakes it (``rrl.agent.resting``)."""

    enabled: bool = True
    p95_fraction: float = 0.5
    """The incumbent rests only while its window's p95 is at most this fraction of the SLO."""
    max_interval_s: float = 4.0
    """The longest decision interval while resting (it doubles from the shortest)."""
    recheck_s: float = 30.0
    """A rest this long ends by itself and the gate is asked again (its calibration may have
    become sure enough to see a gain); every recheck that changes nothing doubles it, a wake
    resets it."""
    wake_alpha: float = 1e-4
    wake_factor: float = 2.0
    """Arrivals consistent with a rate within this factor of the rested rate do not wake it."""
    wake_size_levels: float = 1.0
    degrade_factor: float = 2.0
    degrade_min_ms: float = 1.0
    degrade_windows: int = 2
    """A rest also ends when this many windows running measure the incumbent's p95 above
    ``degrade_factor`` times (and ``degrade_min_ms`` beyond) its typical p95 when the rest
    began: the same load served worse (other work on the cores, a runtime slowing down) is news
    to the gate, even within the SLO's margin."""


ONLINE_TUNERS = ("rrl", "adaptive-rrl", "bo", "hill-climb", "aimd", "inflight", "static")


@dataclass(frozen=True)
class AgentSettings:
    algorithm: str = "adaptive-rrl"
    objective: str = "latency"
    interval_s: float = 0.5
    """Shortest decision interval; with ``min_requests`` the interval adapts to the load."""
    max_interval_s: float = 10.0
    min_requests: int = 40
    tick_s: float = 0.5
    settle_s: float = 0.2
    min_rebuild_gap_s: float = 1.0
    rebuild_duty: float = 0.1
    unsafe_violation_fraction: float = 0.5
    """A candidate window worse than 'p95 at the SLO with this fraction violating' is reverted
    whatever the comparison says."""
    violating_fraction: float = 0.1
    """An incumbent measured worse than 'p95 at the SLO with this fraction violating' lets a
    candidate through without waiting for the rebuild pace or the trial gap."""
    fallback_windows: int = 3
    """An incumbent measured violating (``violating_fraction``) in this many windows running
    goes back to the configuration best measured within the SLO in the state, if any: a trial
    compares a few windows, and one won on noise (or on the incumbent's backlog) must not
    leave the devices on an overload for good."""
    explore_regret: float = 2.0
    """A candidate the tuner's own estimates (profile prior, region estimate) put beyond this many
    times the incumbent's estimate is not considered."""
    backlog_s: float = 0.25
    min_backlog: int = 8
    trial_margin: float = 0.05
    """Smallest relative difference a trial reads as better or worse (see ``rrl.agent.trial``)."""
    closed_loop_trial_windows: int = 12
    """Windows a closed loop's trial (decided by paired differences) may run at most: six a
    side resolve a gain of about 6% at the spread of a difference measured here."""
    trial_gap: int = 3
    """Incumbent windows between two trials: at most a quarter of the windows are trials."""
    measured_search: bool = True
    """When the gate lets nothing through, measure the incumbent's neighbours before resting
    (``rrl.agent.evidence``); off, the agent rests on the gate's prediction alone."""
    measured_trials: int = 12
    """Measured-search trials per workload state at most: each runs a window of a candidate
    that may be worse (and a rebuild), so the search has a budget; spent, the agent rests on
    the best it measured."""
    search_patience: int = 3
    """Measured-search trials lost running after which the agent rests in a state (one more is
    measured at each recheck of the rest): each costs the devices windows of a configuration
    that measured worse, and where the best are within a few percent of each other (a closed
    loop on two cores: a dozen configurations within 5%), a search that went on to its budget
    spent the last third of every run on losing trials."""
    closed_loop_leads: int = 3
    """In a closed loop, the grid's configurations the closed-loop simulation predicts best
    that the measured search adds to the incumbent's neighbours."""
    gate_every_s: float = 2.0
    """How often the gate is asked while nothing changes (a new workload state resets it; an
    incumbent violating the SLO asks at once)."""
    screen_every_s: float = 5.0
    """How often the whole grid is screened by the model (the shortlist is kept in between)."""
    history: int = 200
    start: Knobs | None = None
    monitor: MonitorSettings = field(default_factory=MonitorSettings)
    gate: GateSettings = field(default_factory=GateSettings)
    rest: RestSettings = field(default_factory=RestSettings)
    queue_model: QueueModelSettings = field(default_factory=QueueModelSettings)
    """The queueing model's settings (``rrl.agent.queueing``)."""
