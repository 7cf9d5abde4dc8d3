"""The bench's trace replay with the cores shared (``benchmarks.tuner.replay``) on fixed
service times: without front-end CPU it is ``rrl.replay``'s batcher; the front end's CPU and
another model's batches slow a model's batches; the joint search keeps each window's best."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.tuner.replay import Stream, candidates, score, search, simulate
from rrl import replay as rrl_replay
from rrl.space import Config

FIXED = {(1, 1): {1: [0.002], 8: [0.004]}, (2, 1): {1: [0.002], 8: [0.004]}}
EAGER = Config(8, 0.0, 1, 1, 1)


def _stream(rate: float, seconds: float, per_request_s: float = 0.0, seed: int = 0) -> Stream:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, int(rate * seconds)))
    times = rrl_replay.ServiceTimes(FIXED, per_request_s=per_request_s)
    return Stream(arrivals, np.zeros(arrivals.size, dtype=np.int32), times, slo_s=0.1)


def test_without_front_end_cpu_it_is_the_batcher_of_rrl_replay() -> None:
    s = _stream(300, 5)
    (mine,) = simulate([s], [EAGER], cores=2)
    theirs = rrl_replay.simulate(s.arrivals_s.tolist(), EAGER, s.times, slo_s=s.slo_s)
    np.testing.assert_allclose(mine, theirs)


def test_front_end_cpu_competes_with_the_instances() -> None:
    config = Config(8, 0.0, 2, 1, 1)
    (free,) = simulate([_stream(300, 5)], [config], cores=2)
    (busy,) = simulate([_stream(300, 5, per_request_s=0.004)], [config], cores=2)
    # 1.2 cores of front end on 2 cores: the batches run slower, beyond the front end's delay.
    assert np.percentile(busy, 95) > np.percentile(free, 95) + 0.004


def test_another_models_batches_slow_this_one() -> None:
    alone = simulate([_stream(100, 5)], [Config(8, 0.0, 2, 1, 1)], cores=2)[0]
    shared = simulate(
        [_stream(100, 5), _stream(400, 5, seed=1)],
        [Config(8, 0.0, 2, 1, 1), Config(1, 0.0, 2, 1, 1)],
        cores=2,
    )[0]
    assert np.median(shared) > np.median(alone)


def test_search_ranks_the_joint_grid_and_picks_each_windows_best() -> None:
    a, b = _stream(200, 4), _stream(50, 4, seed=1)
    half = (a.arrivals_s > 2).astype(np.int32)
    a = Stream(a.arrivals_s, half, a.times, a.slo_s)
    b = Stream(b.arrivals_s, (b.arrivals_s > 2).astype(np.int32), b.times, b.slo_s)
    grid = [Config(m, 0.0, c, 1, 1) for m in (1, 8) for c in (1, 2)]
    alone = score([a], [(g,) for g in grid], 2, cores=2)
    picked = candidates(alone, 100.0, 2)
    assert picked and set(picked) <= set(grid)
    joint = score([a, b], [(x, y) for x in picked for y in grid], 2, cores=2)
    best, oracle = search(joint, [100.0, 100.0], exclude=[], k=2)
    assert len(best) == 2 and len(oracle) == 2
    assert best[0].objective([100.0, 100.0]) <= best[1].objective([100.0, 100.0])
    for w, o in enumerate(oracle):
        assert o.objective([100.0, 100.0], w) == pytest.approx(
            min(s.objective([100.0, 100.0], w) for s in joint)
        )
