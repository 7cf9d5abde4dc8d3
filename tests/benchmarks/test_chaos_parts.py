"""Parts of ``iotgw bench chaos`` that need no processes: what the overload case reads from the
gateway's own ``/metrics`` (a real ``GatewayMetrics`` rendered), the choice of cases, and how
the partition case reads failover from the devices' ledger, and the gRPC clients' calls accounted
beside the devices' requests."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from benchmarks.chaos import cli
from benchmarks.chaos.gateway_side import gateway_side, since
from benchmarks.chaos.partition import failover
from benchmarks.chaos.report import account, summarize
from benchmarks.chaos.scenarios import Case
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
    assert "letters of 'abcdf'" in capsys.readouterr().out


def test_failover_is_when_the_cut_replicas_share_stops_waiting() -> None:
    # Requests every 0.1 s from t=0 to 10; the cut lasts from 2 to 8.
    sent = np.arange(0.0, 10.0, 0.1)
    prompt = sent + 0.005
    # A broker that held every third request for the cut member until it came back (9.5).
    held = prompt.copy()
    third = (sent >= 2) & (sent < 8) & (np.arange(sent.size) % 3 == 0)
    held[third] = 9.5
    figures = failover(sent, held, cut_at=2.0, restore_at=8.0)
    assert figures["partition_failover_s"] is None
    assert figures["held_for_cut_replica"] == int(third.sum()) == 20
    assert figures["held_answered_after_restore"] == 20
    assert figures["held_wait_max_s"] == pytest.approx(9.5 - 2.1, abs=0.01)
    # A broker that moved the share to the others 3 s into the cut (one request never answered).
    moved = prompt.copy()
    moved[(sent >= 2) & (sent < 5) & (np.arange(sent.size) % 3 == 0)] = np.nan
    figures = failover(sent, moved, cut_at=2.0, restore_at=8.0)
    assert figures["partition_failover_s"] == pytest.approx(3.0, abs=0.11)
    assert figures["held_answered_after_restore"] == 0
    assert figures["held_wait_max_s"] is None
    # A request sent just before the restore and answered just after it was not held.
    late = moved.copy()
    late[np.argmin(np.abs(sent - 7.9))] = 8.003
    assert failover(sent, late, cut_at=2.0, restore_at=8.0)["held_for_cut_replica"] == 10
    # Nothing held at all: failover at the cut itself.
    assert failover(sent, prompt, cut_at=2.0, restore_at=8.0)["partition_failover_s"] == 0.0


def _ledger(sent: list[float], replied: list[float | None], status: list[int]) -> dict[str, Any]:
    reasons = {i: "deadline" for i, s in enumerate(status) if s not in (0, 200)}
    return {
        "sent_at": sent,
        "replied_at": replied,
        "status": status,
        "reasons": reasons,
        "duplicates": 0,
        "unmatched": 0,
        "reconnects": 0,
        "sessions_lost": 0,
    }


def test_grpc_calls_are_accounted_as_the_devices_requests_are() -> None:
    devices = _ledger([0.0, 0.1, 0.2], [0.01, 0.12, 0.22], [200, 200, 503])
    grpc = _ledger([0.0, 0.5, 1.0], [0.02, None, 1.03], [200, 0, -1])
    case = Case("a_gateway_sigkill", [devices], [], {"rate": 30.0}, [grpc])
    figures = account(case, slo_ms=100.0)
    assert (figures["sent"], figures["answered"], figures["lost"]) == (3, 2, 0)
    assert figures["errors"] == {"deadline": 1}
    assert figures["grpc"]["sent"] == 3 and figures["grpc"]["answered"] == 1
    assert figures["grpc"]["errors"] == {"deadline": 1} and figures["grpc"]["lost"] == 1
    summary = summarize([figures])
    assert (summary["lost_qos1"], summary["lost_grpc"], summary["grpc_sent"]) == (0, 1, 3)
    assert summary["accounted"] is True
    no_grpc = account(Case("b_broker_restart", [devices], [], {}), slo_ms=100.0)
    assert "grpc" not in no_grpc
    assert summarize([no_grpc])["lost_grpc"] is None
