"""The simulator's figures are right: against a responder with a known fixed service time and a
known arrival rate, the reported rate, latency, error and loss counts match."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from device_sim.arrivals import Constant
from device_sim.ledger import Ledger, Outcome
from device_sim.runner import SimOptions, Transport, simulate
from device_sim.scenario import single_phase
from device_sim.summary import summarize
from tests.device_sim.conftest import Mosquitto
from tests.device_sim.responders import METADATA, STAMPS, MqttResponder, http_app, serving

SERVICE_S = 0.020
RATE = 50.0
DURATION_S = 2.0
PLANNED = int(RATE * DURATION_S)
# No reply in these tests may be given up as lost on a busy machine: far beyond any wait.
GENEROUS_TIMEOUT_S = 30.0


async def run_simulation(options: SimOptions) -> tuple[dict[str, Any], Ledger]:
    result = await simulate(options, progress=None)
    summary = summarize(
        result.plan, result.ledger, slo_ms=options.slo_ms, elapsed_s=result.elapsed_s, run={}
    )
    return summary, result.ledger


async def run_summary(options: SimOptions) -> dict[str, Any]:
    return (await run_simulation(options))[0]


def constant_load(transport: Transport, rate: float, duration_s: float, **kw: Any) -> SimOptions:
    return SimOptions(
        transport=transport,
        scenario=single_phase(Constant(rate), duration_s),
        devices=10,
        models=("toy",),
        **{"timeout_s": GENEROUS_TIMEOUT_S, **kw},
    )


@pytest.fixture
def toy_metadata(tmp_path: Any) -> Any:
    import json

    path = tmp_path / "toy.json"
    path.write_text(json.dumps(METADATA))
    return path


def ok_latencies_s(ledger: Ledger) -> np.ndarray:
    ok = ledger.outcome == Outcome.OK
    return np.asarray((ledger.done_at - ledger.sent_at)[ok])


def check_rate_and_latency(
    summary: dict[str, Any], ledger: Ledger, stamps: dict[str, tuple[float, float]]
) -> None:
    r = summary["requests"]
    assert r == {
        "planned": PLANNED,
        "sent": PLANNED,
        "ok": PLANNED,
        "errors": 0,
        "lost": 0,
        "not_sent": 0,
    }
    assert summary["offered_rps"] == RATE
    # Achieved counts replies over [0, max(end, last reply)]: the offered rate, short by at
    # most the last reply's lateness (however busy the machine was).
    last_reply_s = float(np.nanmax(ledger.done_at))
    assert summary["achieved_rps"] == round(PLANNED / max(DURATION_S, last_reply_s), 3)
    assert summary["achieved_rps"] <= RATE
    check_latency_is_measured_at_the_device(ledger, stamps)
    lat = summary["latency_ms"]
    assert lat["min"] >= SERVICE_S * 1000
    want = np.percentile(ok_latencies_s(ledger), [50, 95, 99]) * 1000
    assert [lat["p50"], lat["p95"], lat["p99"]] == pytest.approx(want.tolist(), abs=1e-3)
    assert lat["p50"] <= lat["p95"] <= lat["p99"] <= lat["max"]
    assert sum(row["offered"] for row in summary["timeline"]) == PLANNED
    assert sum(row["ok"] for row in summary["timeline"]) == PLANNED
    # 0.1 s bins for a short run: 5 of the 50 req/s each.
    assert summary["timeline_bin_s"] == 0.1
    bins = int(DURATION_S / 0.1)
    assert {row["offered"] for row in summary["timeline"][:bins]} == {5}
    assert summary["replies"] == {"late": 0, "duplicate": 0, "unmatched": 0}


def check_latency_is_measured_at_the_device(
    ledger: Ledger, stamps: dict[str, tuple[float, float]]
) -> None:
    """Each request's send stamp comes before the server took it, and its reply stamp after
    the server answered it (one clock: responder and simulator share the process)."""
    assert len(stamps) == PLANNED
    for request_id, (taken, answered) in stamps.items():
        i = int(request_id.rsplit("-", 1)[1])
        assert ledger.sent_at[i] <= taken - ledger.origin
        assert answered - ledger.origin <= ledger.done_at[i]
        assert answered - taken >= SERVICE_S


@pytest.mark.parametrize("transport", ["mqtt5", "mqtt311"])
async def test_mqtt_rate_and_latency_match_the_responder(
    mosquitto: Mosquitto, toy_metadata: Any, transport: Transport
) -> None:
    async with MqttResponder(mosquitto.port, service_s=SERVICE_S) as responder:
        summary, ledger = await run_simulation(
            constant_load(
                transport, RATE, DURATION_S, broker=mosquitto.url, metadata_files=(toy_metadata,)
            )
        )
    assert responder.received == PLANNED
    check_rate_and_latency(summary, ledger, responder.stamps)


async def test_http_rate_and_latency_match_the_server() -> None:
    app = http_app(service_s=SERVICE_S)
    async with serving(app) as url:
        # No metadata file: the payload is generated from the server's GET /v2/models/toy.
        summary, ledger = await run_simulation(
            constant_load("http", RATE, DURATION_S, http_url=url)
        )
    check_rate_and_latency(summary, ledger, app[STAMPS])


@pytest.mark.parametrize("transport", ["mqtt5", "mqtt311"])
async def test_every_dropped_request_is_reported_lost(
    mosquitto: Mosquitto, toy_metadata: Any, transport: Transport
) -> None:
    # Given up after 3 s: far beyond any answered request's wait, short enough for a test.
    async with MqttResponder(mosquitto.port, service_s=SERVICE_S, drop_every=10) as responder:
        summary, ledger = await run_simulation(
            constant_load(
                transport,
                100,
                1.0,
                broker=mosquitto.url,
                metadata_files=(toy_metadata,),
                timeout_s=3.0,
                slo_ms=100,
            )
        )
    assert responder.dropped == 10
    r = summary["requests"]
    assert (r["planned"], r["ok"], r["lost"], r["errors"]) == (100, 90, 10, 0)
    assert sum(row["lost"] for row in summary["timeline"]) == 10
    # A lost request is an SLO violation; an answered one only when slower than the SLO.
    late = int((ok_latencies_s(ledger) > 0.100).sum())
    assert summary["slo"]["late"] == late
    assert summary["slo"]["violations"] == 10 + late


async def test_error_replies_are_counted_by_kind(mosquitto: Mosquitto, toy_metadata: Any) -> None:
    async with MqttResponder(mosquitto.port, service_s=0.005, error_every=5) as responder:
        summary = await run_summary(
            constant_load("mqtt5", 100, 1.0, broker=mosquitto.url, metadata_files=(toy_metadata,))
        )
    assert responder.errors == 20
    assert summary["requests"]["errors"] == 20
    assert summary["requests"]["ok"] == 80
    assert summary["errors"] == {"queue_full": {"status": 503, "count": 20}}
    assert sum(sum(row["errors"].values()) for row in summary["timeline"]) == 20


async def test_http_errors_are_counted_by_status() -> None:
    async with serving(http_app(service_s=0.002, error_every=4)) as url:
        summary = await run_summary(constant_load("http", 100, 1.0, http_url=url))
    assert summary["errors"] == {"http_503": {"status": 503, "count": 25}}
    assert summary["requests"]["ok"] == 75


async def test_duplicate_replies_are_counted_not_double_counted(
    mosquitto: Mosquitto, toy_metadata: Any
) -> None:
    async with MqttResponder(mosquitto.port, service_s=0.002, answer_twice=True):
        summary = await run_summary(
            constant_load(
                "mqtt311",
                50,
                1.0,
                broker=mosquitto.url,
                metadata_files=(toy_metadata,),
                # One connection for every device: the replies arrive in the order the
                # responder sent them, each reply's two copies back to back.
                connections=1,
            )
        )
    assert summary["requests"]["ok"] == 50
    # Every duplicate arrives before the next request's first reply, so only the last one
    # can race the end of the run, however busy the machine.
    assert 49 <= summary["replies"]["duplicate"] <= 50


async def test_the_in_flight_bound_refuses_rather_than_queues(
    mosquitto: Mosquitto, toy_metadata: Any
) -> None:
    # Nothing is ever answered: the first 5 requests fill the bound until they time out at
    # 3 s, long after the last of the 20 planned ones (sent over 0.5 s), so exactly 15 are
    # refused however late the simulator runs.
    async with MqttResponder(mosquitto.port, drop_every=1):
        summary = await run_summary(
            constant_load(
                "mqtt5",
                40,
                0.5,
                broker=mosquitto.url,
                metadata_files=(toy_metadata,),
                timeout_s=3.0,
                max_in_flight=5,
                slo_ms=100,
            )
        )
    r = summary["requests"]
    assert (r["planned"], r["sent"], r["lost"], r["not_sent"], r["ok"]) == (20, 5, 5, 15, 0)
    assert summary["errors"] == {}
    assert summary["slo"]["violations"] == 20
