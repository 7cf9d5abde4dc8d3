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

import logging
import math
from pathlib import Path

import numpy as np

from rrl.objective import Objective
from rrl.space import ConfigSpace
from rrl.testbed import ProfileTable, Testbed
from rrl.workload import MonitorSettings, WorkloadState

log = logging.getLogger("rrl.priors")

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


def load_profile_priors(
    profiles_dir: Path,
    model: str,
    objective: Objective,
    *,
    runtime: str,
    cores: int,
    space: ConfigSpace,
    monitor: MonitorSettings,
) -> Priors:
    """The priors of ``model``'s profile in ``profiles_dir`` when it matches what is served
    (runtime, cores) and shares configurations with ``space``; empty otherwise (and why is
    logged)."""
    path = Path(profiles_dir) / f"{model}.json"
    if not path.is_file():
        return {}
    try:
        table = ProfileTable.load(path)
    except (OSError, ValueError, KeyError) as exc:
        log.warning("profile %s not used: %s", path, exc)
        return {}
    profiled = table.doc.get("runtime")
    if profiled != runtime or table.cores != cores:
        log.info(
            "profile %s not used: made for %s on %d cores, serving %s on %d",
            path,
            profiled,
            table.cores,
            runtime,
            cores,
        )
        return {}
    priors = profile_priors(table, objective, space, monitor)
    shared = int(np.isfinite(next(iter(priors.values()))).sum()) if priors else 0
    if shared == 0:
        log.info("profile %s not used: no configuration in common with the grid", path)
        return {}
    log.info(
        "profile %s: priors for %d workload states, %d of %d configurations",
        path,
        len(priors),
        shared,
        space.size,
    )
    return priors
