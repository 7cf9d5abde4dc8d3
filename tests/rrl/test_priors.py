"""Profile priors: the loads of a profile become workload states the online tuner starts from,
only when the profile matches what is served; exploration stays within a bounded regret."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from rrl.agent.decisions import Step
from rrl.offline.priors import load_profile_priors, profile_priors
from rrl.offline.testbed import ProfileTable, Testbed
from rrl.tuners.objective import LatencyObjective
from rrl.tuners.registry import build_tuner
from rrl.tuners.space import ConfigSpace
from rrl.tuners.workload import MonitorSettings, WorkloadState
from tests.rrl.helpers import problem
from tests.rrl.live import BATCHES, gateway, hand_built_agent, measurement, started
from tests.rrl.test_testbed import RATES, SPACE, _doc

OBJECTIVE = LatencyObjective(slo_ms=100.0)
MONITOR = MonitorSettings(base_rate_per_s=1.0)
STATES = [WorkloadState(4), WorkloadState(6), WorkloadState(8)]  # 16, 64 and 256 requests/s


def _write(path: Path, **changes: object) -> Path:
    path.write_text(json.dumps({**_doc(), **changes}))
    return path


def test_each_profiled_load_is_a_workload_state_of_the_monitor(tmp_path: Path) -> None:
    table = ProfileTable.load(_write(tmp_path / "toy.json"))
    priors = profile_priors(table, OBJECTIVE, SPACE, MONITOR)
    assert list(priors) == STATES  # log2 of 16, 64 and 256 requests/s over a 1/s base
    testbed = Testbed(table, OBJECTIVE, seed=0)
    for load, state in enumerate(STATES):
        np.testing.assert_array_equal(priors[state], testbed.truth(load))
    # A finer serving grid: the configurations the profile did not measure have no prior.
    wider = ConfigSpace((1, 2, 4, 8), (0.0, 1.0), (1, 2), (1,), (1,))
    values = profile_priors(table, OBJECTIVE, wider, MONITOR)[STATES[0]]
    for config in wider:
        value = values[wider.flat(config)]
        if config in SPACE:
            assert value == testbed.truth(0)[SPACE.flat(config)]
        else:
            assert np.isnan(value)


def test_a_profile_is_used_only_where_it_matches_what_is_served(tmp_path: Path) -> None:
    _write(tmp_path / "toy.json", runtime="onnxruntime", cores=2)
    (tmp_path / "broken.json").write_text('{"model": "broken", "cells": [')

    def priors(
        model: str, runtime: str = "onnxruntime", cores: int = 2, apart: bool = False
    ) -> int:
        found = load_profile_priors(
            tmp_path,
            model,
            OBJECTIVE,
            runtime=runtime,
            cores=cores,
            space=SPACE,
            monitor=MONITOR,
            apart=apart,
        )
        return len(found)

    assert priors("toy") == len(RATES)
    assert priors("toy", apart=True) == len(RATES)  # read in a process of its own, as served
    assert priors("toy", runtime="tensorflow") == 0  # profiled on another runtime
    assert priors("toy", cores=16) == 0  # ... or on another machine
    assert priors("unprofiled") == 0
    assert priors("broken") == 0  # a broken file costs the warm start, nothing else


def test_a_new_state_starts_from_its_own_prior() -> None:
    tuner = build_tuner("rrl", problem(space=SPACE))
    prior = np.linspace(50.0, 10.0, SPACE.size)  # the last configuration is the best
    prior[3] = np.nan
    assert tuner.set_priors({WorkloadState(6): prior}) == 1
    tuner.set_workload(WorkloadState(6))
    assert tuner.propose() == SPACE.at(SPACE.size - 1)  # the prior's best is measured first
    assert tuner.recommend() == SPACE.at(SPACE.size - 1)
    assert tuner.predict(SPACE.at(1)) == pytest.approx(prior[1])
    assert tuner.predict(SPACE.at(3)) is None  # not profiled: nothing known
    # Measured values override the prior; around them the prior, measured in this very state,
    # still says more than an estimate from neighbours, at the level measured now: 20 where
    # the profile said 50, so every prior is taken at 0.4 of its value.
    tuner.observe(SPACE.at(0), measurement(20.0))
    assert tuner.predict(SPACE.at(0)) == pytest.approx(20.0)
    assert tuner.predict(SPACE.at(1)) == pytest.approx(prior[1] * 0.4)
    assert tuner.predict(SPACE.at(3)) == pytest.approx(20.0)  # no prior: the region's estimate
    # Two measured: the geometric mean of the ratios.
    tuner.observe(SPACE.at(2), measurement(prior[2] * 0.9))
    assert tuner.predict(SPACE.at(1)) == pytest.approx(prior[1] * (0.4 * 0.9) ** 0.5)
    # Something else ran first (a safety layer held the prior's best back): still its turn.
    assert tuner.propose() == SPACE.at(SPACE.size - 1)
    # A state without a prior still starts from the nearest known table.
    tuner.set_workload(WorkloadState(9))
    assert tuner.propose() == SPACE.at(0)
    # Tuners that keep no estimates cannot use priors, and say so.
    assert build_tuner("bo", problem(space=SPACE)).set_priors({WorkloadState(6): prior}) == 0


def test_greedy_exploitation_follows_the_calibrated_prior() -> None:
    # Once the regions are covered, an unmeasured configuration is expected as its calibrated
    # prior says: one the profile rates better than the incumbent is measured; the incumbent's
    # neighbours the profile rates worse are not (without a prior they would be).
    from rrl.tuners.region_rl import RRL, RRLSettings

    rrl = RRL(problem(space=SPACE), RRLSettings(radius=10.0), np.random.default_rng(0))
    prior = np.full(SPACE.size, 40.0)
    prior[0] = 20.0  # the prior's best: measured first
    prior[7] = 22.0  # far from it, and profiled almost as good
    rrl.warm_start_prior(prior)
    assert rrl.propose() == 0
    rrl.observe(0, 10.0, None)  # type: ignore[arg-type]  # half the profile's level
    assert rrl.phase == "exploit"  # one region of radius 10 covers this grid
    assert rrl.expected()[7] == pytest.approx(11.0)  # the prior at half its level
    # Lower bounds with the default noise (cv 0.1): the incumbent 9, configuration 7 9.9, the
    # incumbent's neighbours (prior 40 -> 20) 18: the incumbent runs again ...
    assert rrl.propose() == 0
    rrl.observe(0, 10.0, None)  # type: ignore[arg-type]
    # ... and with agreeing replicates (cv at its floor, 0.01) still: 9.93 against 10.89 and
    # 19.8. Neither the worse-rated configuration 7 nor the neighbours are measured.
    assert rrl.propose() == 0
    # A profile that rates configuration 7 better than the incumbent at today's level.
    rrl.prior[7] = 18.0  # type: ignore[index]
    assert rrl.expected()[7] == pytest.approx(9.0)
    assert rrl.propose() == 7
    # Without a prior, the incumbent's direct neighbours are measured before settling.
    bare = RRL(problem(space=SPACE), RRLSettings(radius=10.0), np.random.default_rng(0))
    bare.observe(0, 10.0, None)  # type: ignore[arg-type]
    bare.observe(0, 10.0, None)  # type: ignore[arg-type]
    assert SPACE.distances[0, bare.propose()] == pytest.approx(1.0)


async def test_the_profile_vetoes_candidates_it_rates_far_worse(
    mlp_repo: Path, tmp_path: Path
) -> None:
    async with gateway(mlp_repo, tmp_path, enabled=False) as gw:
        agent = hand_built_agent(gw, BATCHES, explore_regret=4.0)
        # The profile: batch 2 best (11 ms), batch 16 a poor 50 ms, the rest in between or worse.
        prior = np.array([12.0, 11.0, 15.0, 20.0, 50.0, 60.0, 80.0, 100.0])
        agent.policy.tuner.set_priors({WorkloadState(6): prior})
        agent.policy.workload = WorkloadState(6)
        agent.policy.tuner.set_workload(agent.policy.workload)
        agent.policy.current = agent.policy.incumbent = BATCHES.at(1)
        agent.policy.learn(Step(BATCHES.at(1), "exploit"), measurement(11.0))
        # RRL's next region centre is batch 16, which the profile puts over 4 x the
        # incumbent's 11: not a candidate for the gate.
        assert agent.policy.tuner.propose() == BATCHES.at(4)
        assert BATCHES.at(4) not in agent.policy._candidates(agent.policy.arrivals())
        # With a looser bound batch 16 (50 < 5 x 11) may be considered.
        loose = hand_built_agent(gw, BATCHES, explore_regret=5.0)
        loose.policy.tuner.set_priors({WorkloadState(6): prior})
        loose.policy.workload = WorkloadState(6)
        loose.policy.tuner.set_workload(loose.policy.workload)
        loose.policy.current = loose.policy.incumbent = BATCHES.at(1)
        loose.policy.learn(Step(BATCHES.at(1), "exploit"), measurement(11.0))
        assert loose.policy.tuner.propose() == BATCHES.at(4)  # RRL's next region centre: batch 16
        assert BATCHES.at(4) in loose.policy._candidates(loose.policy.arrivals())


async def test_the_gateway_warm_starts_its_agents_from_a_matching_profile(
    mlp_repo: Path, tmp_path: Path
) -> None:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    cores = len(os.sched_getaffinity(0))
    _write(profiles / "sensor_mlp.json", model="sensor_mlp", runtime="onnxruntime", cores=cores)
    async with gateway(mlp_repo, tmp_path, profiles_dir=profiles) as gw:
        assert gw.tuning is not None
        agent = await started(gw)  # priors loaded (in a process of their own) before the start
        assert agent.prior_states == len(RATES)
    async with gateway(mlp_repo, tmp_path, profiles_dir=profiles, profiles=False) as gw:
        agent = await started(gw)
        assert agent.prior_states == 0
