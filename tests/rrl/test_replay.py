"""The trace replay's batcher model (``rrl.offline.replay``) and the expert default it is compared
with.

Service times are fixed here (one value per batch size), so each case's latencies follow from the
batcher's rules alone: what eager batching, a timeout and batch size 1 do to a trickle and to a
rate above what batch 1 can serve.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from models.knobs import Knobs
from rrl.offline.replay import (
    ServiceTimes,
    closed_loop_throughput,
    figures,
    request_grid,
    score,
    simulate,
)
from rrl.tuners.space import expert_default

MS = 1e-3
# One instance: 1 ms for a batch of 1, 2 ms for up to 32 rows (the per-call cost dominates).
TIMES = ServiceTimes({(1, 1): {1: [1 * MS], 32: [2 * MS]}, (2, 1): {1: [1 * MS], 32: [2 * MS]}})
SLO_S = 0.1


def trickle(n: int = 50, gap_s: float = 0.05) -> list[float]:
    return [i * gap_s for i in range(n)]


def poisson(rate: float, seconds: float, seed: int = 0) -> list[float]:
    rng = np.random.default_rng(seed)
    return np.cumsum(rng.exponential(1 / rate, int(rate * seconds))).tolist()


def test_eager_batching_serves_a_trickle_one_by_one_without_waiting() -> None:
    lat = simulate(trickle(), Knobs(32, 0.0, 1, 1, 1), TIMES, slo_s=SLO_S)
    assert lat == pytest.approx([1 * MS] * 50)


def test_a_timeout_waits_only_while_another_request_is_expected() -> None:
    # One request every 50 ms: once the batcher has watched enough busy time without another
    # arrival, none is expected within a 4 ms window, so none waits (the gateway's batcher
    # dispatches at once); the first three wait the whole timeout: 5 and 10 ms of busy time
    # watched (3 arrivals of prior over it) still expect one in 4 ms, 15 ms no longer does.
    lat = simulate(trickle(), Knobs(32, 4.0, 1, 1, 1), TIMES, slo_s=SLO_S)
    assert lat == pytest.approx([5 * MS] * 3 + [1 * MS] * 47)
    # One every 1 ms: each batch of 4 waits for its 4th arrival, then 2 ms of service.
    dense = trickle(n=64, gap_s=1 * MS)
    lat = simulate(dense, Knobs(4, 4.0, 1, 1, 1), TIMES, slo_s=SLO_S)
    assert lat[60:64] == pytest.approx([(3 - i) * MS + 2 * MS for i in range(4)])


def test_batch_one_collapses_above_its_capacity_where_eager_batching_keeps_up() -> None:
    burst = poisson(1500.0, 2.0)  # batch 1 serves 1000/s on one instance
    batch1 = figures(simulate(burst, Knobs(1, 0.0, 1, 1, 1), TIMES, slo_s=SLO_S), SLO_S)
    eager = figures(simulate(burst, Knobs(32, 0.0, 1, 1, 1), TIMES, slo_s=SLO_S), SLO_S)
    assert batch1.violations > len(burst) // 4
    assert eager.violations == 0


def test_requests_past_their_deadline_are_refused_not_served() -> None:
    burst = [0.0] * 500  # 500 at once on one instance at batch 1: 0.5 s of work, SLO 0.1 s
    lat = simulate(burst, Knobs(1, 0.0, 1, 1, 1), TIMES, slo_s=SLO_S)
    served = [x for x in lat if math.isfinite(x)]
    assert 90 <= len(served) <= 102
    assert figures(lat, SLO_S).violations == 500 - sum(1 for x in served if x <= SLO_S)


def test_the_gateway_costs_add_to_every_request_and_batch() -> None:
    times = ServiceTimes(TIMES.samples, per_batch_s=0.5 * MS, per_request_s=0.25 * MS)
    lat = simulate(trickle(), Knobs(32, 0.0, 1, 1, 1), times, slo_s=SLO_S)
    assert lat == pytest.approx([1.75 * MS] * 50)


def test_on_one_serial_loop_more_instances_serve_no_more_batches_of_one() -> None:
    # 0.5 ms per batch and 0.25 ms per request on the loop, 1 ms of inference: batch 1 is
    # served at most every 0.75 ms however many instances, while in parallel two instances
    # would each pay the costs as a delay of their own.
    times = ServiceTimes(TIMES.samples, per_batch_s=0.5 * MS, per_request_s=0.25 * MS)
    burst = poisson(2000.0, 1.0)
    done = {}
    for c in (1, 2):
        lat = simulate(burst, Knobs(1, 0.0, c, 1, 1), times, slo_s=SLO_S, serial=True)
        ends = sorted(a + x for a, x in zip(burst, lat, strict=True) if math.isfinite(x))
        assert np.all(np.diff(ends) >= 0.75 * MS - 1e-9)
        done[c] = len(ends)
    parallel = simulate(burst, Knobs(1, 0.0, 2, 1, 1), times, slo_s=SLO_S)
    assert sum(math.isfinite(x) for x in parallel) > done[2]
    # At a trickle the loop is free: a request pays its costs once, as before.
    lat = simulate(trickle(), Knobs(32, 0.0, 1, 1, 1), times, slo_s=SLO_S, serial=True)
    assert lat == pytest.approx([1.75 * MS] * 50)


def test_a_closed_loop_without_decoding_serves_its_batches_back_to_back() -> None:
    # 1 ms a batch plus 0.5 ms a row; 32 clients always in.
    def batch_s(rows: int) -> float:
        return 0.001 + 0.0005 * rows

    # Batch 32 on one instance: all 32 every 17 ms, so 32 / 17 ms.
    one = closed_loop_throughput(32, Knobs(32, 0.0, 1, 1, 1), batch_s, 0.0)
    assert one == pytest.approx(32 / 0.017)
    # Batch 2 on 2 instances: 4 answers every 2 ms (the first batches' span aside).
    two = closed_loop_throughput(32, Knobs(2, 0.0, 2, 1, 1), batch_s, 0.0)
    assert two == pytest.approx(2000.0, rel=0.01)
    assert closed_loop_throughput(0, Knobs(2, 0.0, 2, 1, 1), batch_s, 0.0) is None
    assert closed_loop_throughput(32, Knobs(2, 0.0, 2, 1, 1), lambda rows: None, 0.0) is None


def test_a_timeout_that_lets_a_decoded_loop_fill_its_batch_serves_it_faster() -> None:
    """Four clients, 10 ms a batch of any size, 1 ms to decode each request, two instances.
    A timeout of 4 ms: the four answers come back together, are decoded by 4 ms after, and
    leave as one batch of four: four answers every 14 ms. Eager: the first decoded request
    leaves alone on one instance, the second on the other, and the loop runs split in two
    halves that keep one instance waiting on the other's decoding."""
    eager = closed_loop_throughput(4, Knobs(4, 0.0, 2, 1, 1), lambda rows: 0.010, 0.001)
    waits = closed_loop_throughput(4, Knobs(4, 4.0, 2, 1, 1), lambda rows: 0.010, 0.001)
    assert waits == pytest.approx(4 / 0.014)
    assert eager is not None and waits is not None and eager < 0.9 * waits
    # A batch the loop cannot fill (8 > the 4 clients) does not wait out its timeout: once
    # the four are read, the batcher's estimate (arrivals while it holds requests: the three
    # that follow each round's first, over its busy time) expects no fifth within the 1 ms
    # left, and the batch leaves, as the gateway's batcher does: 14 ms a round, not 15.
    too_big = closed_loop_throughput(4, Knobs(8, 4.0, 2, 1, 1), lambda rows: 0.010, 0.001)
    assert too_big == pytest.approx(4 / 0.014)


def test_the_loops_cost_per_batch_makes_a_loop_bound_closed_loop_faster_with_fuller_batches() -> (
    None
):
    """32 clients, a model whose batches take 10 us, a loop that spends 0.2 ms per request and
    0.3 ms per batch. The loop forms each batch and hands it over before its inference starts,
    so eager batching (a batch as soon as a request is decoded) pays the batch's cost per
    request: 0.5 ms each, 2,000/s. A timeout long enough for the whole loop's requests (32 x
    0.2 ms) forms batches of 32: 0.2 + 0.3 / 32 ms each, about 4,770/s. Without a cost per
    batch the two are the same."""

    def batch_s(rows: int) -> float:
        return 0.00001

    def rate(config: Knobs, per_batch_s: float) -> float:
        found = closed_loop_throughput(32, config, batch_s, 0.0002, per_batch_s=per_batch_s)
        assert found is not None
        return found

    eager, fills = Knobs(32, 0.0, 1, 1, 1), Knobs(32, 8.0, 1, 1, 1)
    assert rate(eager, 0.0003) == pytest.approx(1 / 0.0005, rel=0.02)
    assert rate(fills, 0.0003) == pytest.approx(32 / (32 * 0.0002 + 0.0003), rel=0.02)
    assert rate(eager, 0.0) == pytest.approx(rate(fills, 0.0), rel=0.02)


def test_a_timer_come_due_waits_for_the_requests_already_read() -> None:
    """32 clients, 0.2 ms to decode each request (6.4 ms for the wave), 0.3 ms per batch. A
    2 ms timeout comes due while the wave is being decoded, but runs only after it (the loop's
    pass): one batch of 32 a wave, as the gateway measured (31.5 rows at 2 ms), and no slower
    than an 8 ms timeout, which the whole wave beats. A batch larger than the loop (128 on
    two instances) cannot fill: it waits out its timeout every wave."""

    def batch_s(rows: int) -> float:
        return 0.00001

    def rate(config: Knobs) -> float:
        found = closed_loop_throughput(32, config, batch_s, 0.0002, per_batch_s=0.0003)
        assert found is not None
        return found

    wave = 32 / (32 * 0.0002 + 0.0003 + 0.00001)
    assert rate(Knobs(32, 2.0, 1, 1, 1)) == pytest.approx(wave, rel=0.01)
    assert rate(Knobs(32, 2.0, 1, 1, 1)) == rate(Knobs(32, 8.0, 1, 1, 1))
    assert rate(Knobs(128, 8.0, 2, 1, 1)) == pytest.approx(
        32 / (0.0002 + 0.008 + 0.0003 + 0.00001), rel=0.01
    )


def test_score_reports_each_phase_and_the_grid_skips_timeouts_at_batch_one() -> None:
    grid = request_grid([(1, 1), (2, 1)], [1, 32], [0.0, 4.0])
    assert len(grid) == 2 * 3
    arrivals = trickle(20) + [1.0 + t for t in poisson(1500.0, 1.0)]
    phase = [0] * 20 + [1] * (len(arrivals) - 20)
    scored = {s.config: s for s in score(grid, arrivals, phase, 2, TIMES, slo_s=SLO_S)}
    eager = scored[Knobs(32, 0.0, 1, 1, 1)]
    assert eager.phases[0].p95_ms == pytest.approx(1.0)
    assert sum(f.requests for f in eager.phases) == eager.overall.requests == len(arrivals)
    assert scored[Knobs(1, 0.0, 1, 1, 1)].phases[1].violations > 0


@pytest.mark.parametrize("cores", [1, 2, 3, 8, 16])
def test_the_expert_default_never_oversubscribes_the_cores(cores: int) -> None:
    config = expert_default(cores, max_batch_size=128)
    assert config.concurrency * config.intra_op_threads <= cores
    assert (config.batch_timeout_ms, config.inter_op_threads) == (0.0, 1)
    assert config.max_batch_size == 32
    assert expert_default(cores, max_batch_size=12).max_batch_size == 8


@pytest.mark.parametrize(
    ("cores", "instances", "threads"), [(1, 1, 1), (2, 1, 2), (4, 2, 2), (16, 4, 4)]
)
def test_the_expert_default_leaves_the_event_loop_a_core_per_instance(
    cores: int, instances: int, threads: int
) -> None:
    config = expert_default(cores, max_batch_size=128)
    assert (config.concurrency, config.intra_op_threads) == (instances, threads)
