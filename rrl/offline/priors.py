"""Priors from a profile: what ``iotgw profile`` measured on this machine, as warm-start tables.

A profile (``rrl/profiles/<model>.json``) holds, per offered load, every configuration's
measured windows. For an online tuner each profiled load is a workload state it already knows:
the mean objective of each configuration there is a prior estimate, exactly what a state seen
before would hand a new one (``PerWorkload`` warm start), except that it was measured offline.
Online measurements override it as they come, as they override region estimates.

A profile is used only where it describes what is served: the same model name, the same runtime
and the same number of usable cores (a profile of another machine says little about this one).
Configurations of the serving grid the profile did not measure (a coarser profile grid) get no
prior (NaN).
"""

from __future__ import annotations

import functools
import logging
import math
import multiprocessing
import signal
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from rrl.offline.testbed import ProfileTable, Testbed
from rrl.tuners.objective import Objective
from rrl.tuners.space import ConfigSpace
from rrl.tuners.workload import MonitorSettings, WorkloadState

log = logging.getLogger("rrl.offline.priors")

Priors = dict[WorkloadState, np.ndarray]


def profile_priors(
    table: ProfileTable, objective: Objective, space: ConfigSpace, monitor: MonitorSettings
) -> Priors:
    """Per profiled load, the workload state the online monitor would call it and the mean
    objective of every configuration of ``space`` measured there (NaN where not measured)."""
    truths = Testbed(table, objective, seed=0)
    index = np.array(
        [table.space.flat(c) if c in table.space else -1 for c in space.configs], dtype=np.int64
    )
    known = index >= 0
    priors: Priors = {}
    for load, spec in enumerate(table.loads):
        state = WorkloadState(
            round(monitor.level_of(spec.rate_per_s)), round(math.log2(spec.rows_per_request))
        )
        values = np.full(space.size, np.nan)
        values[known] = truths.truth(load)[index[known]]
        priors[state] = values
    return priors


def read_profile_priors(
    profiles_dir: Path,
    model: str,
    objective: Objective,
    *,
    runtime: str,
    cores: int,
    space: ConfigSpace,
    monitor: MonitorSettings,
) -> tuple[Priors, str]:
    """The priors of ``model``'s profile in ``profiles_dir`` when it matches what is served
    (runtime, cores) and shares configurations with ``space``, else empty; and a line saying
    which (for the log)."""
    path = Path(profiles_dir) / f"{model}.json"
    if not path.is_file():
        return {}, f"no profile {path}"
    try:
        table = ProfileTable.load(path)
    except (OSError, ValueError, KeyError) as exc:
        return {}, f"profile {path} not used: {exc}"
    profiled = table.doc.get("runtime")
    if profiled != runtime or table.cores != cores:
        return {}, (
            f"profile {path} not used: made for {profiled} on {table.cores} cores, "
            f"serving {runtime} on {cores}"
        )
    priors = profile_priors(table, objective, space, monitor)
    shared = int(np.isfinite(next(iter(priors.values()))).sum()) if priors else 0
    if shared == 0:
        return {}, f"profile {path} not used: no configuration in common with the grid"
    return priors, (
        f"profile {path}: priors for {len(priors)} workload states, "
        f"{shared} of {space.size} configurations"
    )


def load_profile_priors(
    profiles_dir: Path,
    model: str,
    objective: Objective,
    *,
    runtime: str,
    cores: int,
    space: ConfigSpace,
    monitor: MonitorSettings,
    apart: bool = False,
) -> Priors:
    """``read_profile_priors``, logged. ``apart``: in a process of its own. Reading a profile
    is a second or so of parsing and pooling latencies, Python work that holds the interpreter
    lock: in a thread of a serving process it would stall the event loop (requests queued
    past their deadlines were seen with a 4 MB profile); a spawned process leaves it alone."""
    read = functools.partial(
        read_profile_priors,
        profiles_dir,
        model,
        objective,
        runtime=runtime,
        cores=cores,
        space=space,
        monitor=monitor,
    )
    if apart:
        spawn = multiprocessing.get_context("spawn")  # no fork of a process running sessions
        with ProcessPoolExecutor(
            max_workers=1, mp_context=spawn, initializer=leave_ctrl_c_to_the_parent
        ) as pool:
            priors, why = pool.submit(read).result()
    else:
        priors, why = read()
    # A profile that exists but cannot be used is worth a warning; a missing one is not.
    unusable = not priors and (Path(profiles_dir) / f"{model}.json").is_file()
    log.log(logging.WARNING if unusable else logging.INFO, "%s", why)
    return priors


def leave_ctrl_c_to_the_parent() -> None:
    """A pool worker's initializer: SIGINT ignored. Ctrl-C in a terminal signals the whole
    foreground process group; the parent handles it and shuts its pools down, where a worker
    taking it too would die of a KeyboardInterrupt and print its traceback over the shutdown."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
