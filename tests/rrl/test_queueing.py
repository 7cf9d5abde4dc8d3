"""The agent's queueing model charges the gateway's front end on one serial event loop: more
instances are not predicted to bring more front ends, a model whose loop work dwarfs its
inference is predicted to need batching above batch 1's capacity, and the loop's cost the
gateway measures moves the predictions (and drops the cached ones)."""

from __future__ import annotations

import pytest

from models.knobs import Knobs
from rrl.agent.queueing import Arrivals, QueueModel, QueueModelSettings
from rrl.tuners.objective import make_objective

TINY = {1: [1e-5] * 10, 8: [1.2e-5] * 10, 32: [1.6e-5] * 10}
"""sensor_mlp's batches inside the runtime call: about 10 us whatever the size."""
LOOP_S = 0.0003
"""The loop's CPU per request measured on sensor_mlp over HTTP."""
BATCH_S = 0.0005
"""The loop's cost per batch these rules are stated with (not the shipped prior's value)."""


def _model(per_request_s: float = LOOP_S) -> QueueModel:
    model = QueueModel(
        make_objective("latency", slo_ms=100.0, cores=2),
        cores=2,
        settings=QueueModelSettings(per_batch_s=BATCH_S),
    )
    for setting in ((1, 1), (2, 1), (4, 1)):
        model.observe_service(setting, TINY)
    model.observe_front_end(per_request_s)
    return model


def _p95(model: QueueModel, config: Knobs, rate: float) -> float:
    prediction = model.predict(config, Arrivals(rate))
    assert prediction is not None
    return prediction.p95_ms


@pytest.mark.parametrize("rate", [300.0, 1400.0])
def test_more_instances_are_not_more_front_ends(rate: float) -> None:
    model = _model()
    one, four = (_p95(model, Knobs(32, 0.0, c, 1, 1), rate) for c in (1, 4))
    assert four >= one - 0.05  # what four instances could overlap is 10 us of inference


def test_above_batch_one_capacity_the_loop_needs_batches() -> None:
    # 0.3 ms per request and 0.5 ms per batch on one loop: batch 1 serves about 1,250/s,
    # whatever the instances; a short timeout forms batches and keeps up.
    model = _model()
    for c in (1, 4):
        collapsed = model.predict(Knobs(1, 0.0, c, 1, 1), Arrivals(1800.0))
        assert collapsed is not None and collapsed.violation_fraction > 0.01
    batched = model.predict(Knobs(32, 1.0, 1, 1, 1), Arrivals(1800.0))
    assert batched is not None and batched.violation_fraction == 0.0
    assert batched.p95_ms < 20.0


def test_the_loop_cost_measured_moves_the_predictions_and_drops_the_cache() -> None:
    model = _model(per_request_s=0.0)
    config = Knobs(8, 0.0, 1, 1, 1)
    cheap = _p95(model, config, 1000.0)
    simulated = model.simulations
    model.observe_front_end(0.0)  # unchanged: answered from the cache
    assert _p95(model, config, 1000.0) == pytest.approx(cheap)
    assert model.simulations == simulated
    model.observe_front_end(LOOP_S)
    assert _p95(model, config, 1000.0) > cheap + 0.3  # at least the request's own loop work
    assert model.simulations == 2 * simulated


def test_a_tiny_models_service_time_wobble_keeps_the_cache_and_a_real_move_drops_it() -> None:
    model = _model()
    config = Knobs(8, 0.0, 1, 1, 1)
    before = _p95(model, config, 1000.0)
    simulated = model.simulations
    # 10 us batches measured at 18 us: +80%, yet 8 us against the loop's 0.5 ms per batch.
    model.observe_service((1, 1), {size: [1.8e-5] * 10 for size in TINY})
    assert _p95(model, config, 1000.0) == pytest.approx(before)
    assert model.simulations == simulated
    # A move of a tenth of a millisecond per batch is one the loop's budget notices.
    model.observe_service((1, 1), {size: [1.2e-4] * 10 for size in TINY})
    _p95(model, config, 1000.0)
    assert model.simulations == 2 * simulated


def test_a_closed_loop_is_predicted_on_the_loop_that_decodes_it_and_follows_its_cost() -> None:
    """32 clients on sensor_mlp's batches: with a timeout that lets the loop's 32 requests fill
    one batch, the loop's 0.3 ms per request (plus its 0.5 ms per batch) caps them near
    3,100/s whatever the instances, so each waits about 32 / 3,100 s; eager batching pays the
    loop's cost per batch far more often and is predicted slower; a loop ten times cheaper is
    predicted about ten times faster, not from the cache."""
    model = _model()
    config = Knobs(32, 8.0, 2, 1, 1)
    slow = model.closed_loop_ms(config, 32)
    assert slow is not None and 32 / 3400 * 1e3 < slow < 32 / 2800 * 1e3
    assert model.closed_loop_ms(Knobs(32, 8.0, 1, 1, 1), 32) == pytest.approx(slow, rel=0.05)
    eager = model.closed_loop_ms(Knobs(32, 0.0, 2, 1, 1), 32)
    assert eager is not None and eager > 1.5 * slow
    model.observe_front_end(LOOP_S / 10)
    fast = model.closed_loop_ms(config, 32)
    assert fast is not None and fast < slow / 4
    assert model.closed_loop_ms(config, 0) is None
    unmeasured = QueueModel(make_objective("latency", slo_ms=100.0, cores=2), cores=2)
    assert unmeasured.closed_loop_ms(config, 32) is None


def test_batch_times_between_and_below_the_measured_sizes_follow_straight_lines() -> None:
    """A gateway that has run only full batches of 32 has not measured batch 16: its time is
    taken in proportion (what it might gain), not as the full batch's. With 8 and 32 measured,
    the sizes between lie on the line joining them, and the ones below on its extension, never
    below the proportion of the smallest's time."""
    model = QueueModel(make_objective("latency", slo_ms=100.0, cores=2), cores=2)
    per_batch = model.settings.per_batch_s
    model.observe_service((1, 1), {32: [0.032] * 5})
    config = Knobs(32, 0.0, 1, 1, 1)

    def ms(rows: int) -> float:
        seconds = model.batch_seconds(config, rows)
        assert seconds is not None
        return 1000.0 * (seconds - per_batch)

    assert ms(16) == pytest.approx(16.0) and ms(64) == pytest.approx(64.0)
    model.observe_service((1, 1), {8: [0.012] * 5})  # 12 ms at 8, 32 ms at 32: 20 / 24 a row
    assert ms(16) == pytest.approx(12.0 + 8 * (20.0 / 24))
    assert ms(20) == pytest.approx(12.0 + 12 * (20.0 / 24))
    assert ms(4) == pytest.approx(12.0 - 4 * (20.0 / 24))
    assert ms(1) == pytest.approx(12.0 - 7 * (20.0 / 24))
    assert ms(1) >= 12.0 / 8
