"""Parts of ``iotgw bench chaos`` that need no processes: what the overload case reads from the
gateway's own ``/metrics`` (a real ``GatewayMetrics`` rendered), and the choice of cases."""

from __future__ import annotations

import pytest

from benchmarks.chaos import cli
from benchmarks.chaos.gateway_side import gateway_side, since
from gateway.metrics import GatewayMetrics

MODEL = "sensor_mlp"


def _record(metrics: GatewayMetrics, outcome: str, seconds: float, model: str = MODEL) -> None:
    metrics.requests.labels(model, "1", "mqtt", outcome).inc()
    metrics.latency_seconds.labels(model, "1", "mqtt").observe(seconds)


def test_the_gateway_side_of_a_stretch_of_load() -> None:
    metrics = GatewayMetrics()
    _record(metrics, "ok", 0.003)
    before = gateway_side(metrics.render().decode(), MODEL)
    for seconds in (0.004, 0.030, 0.150):
        _record(metrics, "ok", seconds)
    _record(metrics, "deadline", 0.0002)
    metrics.rejections.labels(MODEL, "1", "deadline").inc()
    _record(metrics, "ok", 0.001, model="vision_cnn")  # another model: not counted
    after = gateway_side(metrics.render().decode(), MODEL)

    added = since(before, after)
    assert added["requests"] == {"deadline": 1, "ok": 3}
    assert added["rejections"] == {"deadline": 1}
    latency = added["latency_le_ms"]  # cumulative, as Prometheus buckets are
    assert (latency["5"], latency["50"], latency["100"], latency["inf"]) == (2, 3, 3, 4)
    assert after["requests"]["ok"] == 4


def test_cases_are_chosen_by_letter() -> None:
    with pytest.raises(SystemExit):
        cli(["--cases", "dx"])
    with pytest.raises(SystemExit):
        cli(["--cases", ""])


def test_iotgw_bench_takes_the_chaos_options_for_chaos_only(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from gateway.cli import main

    assert main(["bench", "http", "--cases", "d"]) == 2
    assert "chaos options" in capsys.readouterr().out
    assert main(["bench", "chaos", "--cases", "dx"]) == 2
    assert "letters of 'abcd'" in capsys.readouterr().out
