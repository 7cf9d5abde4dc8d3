"""The bench's trace replay (``benchmarks.tuner.replay``) on fixed service times: without the
gateway's costs it is ``rrl.offline.replay``'s batcher; the event loop is one serial server, so it
cannot answer faster than its per-request and per-batch costs allow, whatever the instances;
the other processes' CPU and another model's batches slow a model's batches; the calibration
splits the loop's CPU into per request and per batch; the joint search keeps each window's
best."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.tuner.cpu import CpuUse
from benchmarks.tuner.replay import Stream, candidates, replay, score, search, simulate
from benchmarks.tuner.servicetimes import Costs, calibrate
from models.knobs import Knobs
from rrl.offline import replay as rrl_replay

FIXED = {(c, 1): {1: [0.002], 8: [0.004]} for c in (1, 2, 4)}
CHEAP = {(c, 1): {1: [1e-5], 8: [2e-5]} for c in (1, 2, 4)}
EAGER = Knobs(8, 0.0, 1, 1, 1)


def _stream(
    rate: float,
    seconds: float,
    *,
    per_request_s: float = 0.0,
    per_batch_s: float = 0.0,
    background_s: float = 0.0,
    samples: dict[tuple[int, int], dict[int, list[float]]] = FIXED,
    seed: int = 0,
) -> Stream:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, int(rate * seconds)))
    times = Costs(samples, per_batch_s, per_request_s, background_s)
    return Stream(arrivals, np.zeros(arrivals.size, dtype=np.int32), times, slo_s=0.1)


def test_without_gateway_costs_it_is_the_batcher_of_rrl_replay() -> None:
    s = _stream(300, 5)
    (mine,) = simulate([s], [EAGER], cores=2)
    theirs = rrl_replay.simulate(s.arrivals_s.tolist(), EAGER, s.times, slo_s=s.slo_s)
    np.testing.assert_allclose(mine, theirs)


def _answered_by(s: Stream, latencies: np.ndarray) -> np.ndarray:
    """When each answered request's reply was done, in order."""
    return np.sort((latencies + s.arrivals_s)[np.isfinite(latencies)])


@pytest.mark.parametrize("concurrency", [1, 4])
@pytest.mark.parametrize("per_request_s, per_batch_s", [(0.002, 0.0), (0.0, 0.002)])
def test_the_loop_answers_no_faster_than_its_cost_allows(
    concurrency: int, per_request_s: float, per_batch_s: float
) -> None:
    # 1,000 requests/s against a loop that needs 2 ms each (at batch 1, the batch's cost is
    # the request's): however many instances, the k-th answer is at least k x 2 ms in.
    s = _stream(1000, 2, per_request_s=per_request_s, per_batch_s=per_batch_s)
    (lat,) = simulate([s], [Knobs(1, 0.0, concurrency, 1, 1)], cores=2)
    done = _answered_by(s, lat)
    assert done.size > 0
    floor = s.arrivals_s[0] + 0.002 * np.arange(1, done.size + 1)
    assert np.all(done >= floor - 1e-9)


@pytest.mark.parametrize("rate", [50, 400])
def test_more_instances_never_make_the_loop_cheaper(rate: float) -> None:
    # Inference is cheap against the loop's cost per batch (sensor_mlp's case): the loop pays
    # every batch, and more instances can only start more, smaller ones.
    s = _stream(rate, 4, per_request_s=0.0005, per_batch_s=0.002, samples=CHEAP)
    runs = {c: replay([s], [Knobs(8, 0.0, c, 1, 1)], cores=2) for c in (1, 2, 4)}
    for fewer, more in ((1, 2), (2, 4)):
        assert runs[more].batches[0] >= runs[fewer].batches[0]
        assert runs[more].loop_cpu_s >= runs[fewer].loop_cpu_s - 1e-9
    # Nor the answers faster, beyond the (tiny) inference that the instances overlap.
    p95 = {c: np.percentile(r.latencies[0], 95) for c, r in runs.items()}
    assert p95[4] >= p95[1] - 1e-4


def test_other_processes_cpu_competes_with_the_instances() -> None:
    config = Knobs(8, 0.0, 2, 1, 1)
    (free,) = simulate([_stream(300, 5)], [config], cores=2)
    (busy,) = simulate([_stream(300, 5, background_s=0.004)], [config], cores=2)
    # 1.2 cores of other work on 2 cores: the batches run slower.
    assert np.percentile(busy, 95) > np.percentile(free, 95)


def test_calibration_splits_the_loops_cpu_per_request_and_per_batch() -> None:
    # 1 ms per request and 2 ms per batch: 3 ms a request at batch 1, 1.5 ms at 4 rows a batch.
    one = CpuUse(1000, 1000, 1000, loop_s=3.0, gateway_s=3.1, others_s=0.5)
    top = CpuUse(1000, 250, 1000, loop_s=1.5, gateway_s=1.6, others_s=0.5)
    costs = calibrate({(1, 1): {1: [0.001]}}, {"batch1": one, "max": top})
    assert costs.per_request_s == pytest.approx(0.001)
    assert costs.per_batch_s == pytest.approx(0.002)
    assert costs.background_s == pytest.approx(0.0005)
    # Ramps that batched alike cannot tell the two apart: all of it per request.
    alike = CpuUse(1000, 950, 1000, loop_s=2.9, gateway_s=3.0, others_s=0.5)
    costs = calibrate({(1, 1): {1: [0.001]}}, {"batch1": one, "max": alike})
    assert (costs.per_request_s, costs.per_batch_s) == (pytest.approx(0.003), 0.0)


def test_batch_one_saturating_below_the_loops_cpu_charges_the_rest_per_batch() -> None:
    # 0.3 ms of loop CPU per request, none per batch, 10 us of inference; batch 1 served
    # 1,000/s: the serial path held each batch 1 ms, 0.69 ms of it no CPU.
    cpu = {"batch1": CpuUse(1000, 1000, 1000, 0.3, 0.35, 0.3)}
    cpu["max"] = CpuUse(1000, 200, 1000, 0.3, 0.35, 0.3)
    samples = {(1, 2): {1: [1e-5]}}
    costs = calibrate(samples, cpu, (1000.0, (1, 2)))
    assert costs.per_request_s == pytest.approx(0.0003)
    assert costs.per_batch_s == pytest.approx(0.00069)
    s = _stream(
        1500, 2, per_request_s=costs.per_request_s, per_batch_s=costs.per_batch_s, samples=samples
    )
    (lat,) = simulate([s], [Knobs(1, 0.0, 1, 2, 1)], cores=2)
    assert np.count_nonzero(lat > s.slo_s) > 0  # batch 1 no longer keeps up at 1,500/s
    # A model whose batch-1 capacity its inference explains (vision_cnn's) keeps the CPU fit.
    slow = {(1, 2): {1: [0.002]}}
    assert calibrate(slow, cpu, (450.0, (1, 2))).per_batch_s == pytest.approx(0.0)


def test_another_models_batches_slow_this_one() -> None:
    alone = simulate([_stream(100, 5)], [Knobs(8, 0.0, 2, 1, 1)], cores=2)[0]
    shared = simulate(
        [_stream(100, 5), _stream(400, 5, seed=1)],
        [Knobs(8, 0.0, 2, 1, 1), Knobs(1, 0.0, 2, 1, 1)],
        cores=2,
    )[0]
    assert np.median(shared) > np.median(alone)


def test_search_ranks_the_joint_grid_and_picks_each_windows_best() -> None:
    a, b = _stream(200, 4), _stream(50, 4, seed=1)
    half = (a.arrivals_s > 2).astype(np.int32)
    a = Stream(a.arrivals_s, half, a.times, a.slo_s)
    b = Stream(b.arrivals_s, (b.arrivals_s > 2).astype(np.int32), b.times, b.slo_s)
    grid = [Knobs(m, 0.0, c, 1, 1) for m in (1, 8) for c in (1, 2)]
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
