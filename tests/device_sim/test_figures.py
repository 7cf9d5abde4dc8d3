"""The simulator's figures are right: against a responder with a known fixed service time and a
known arrival rate, the reported rate, latency, error and loss counts match."""

from __future__ import annotations

from typing import Any

import pytest

from device_sim.arrivals import Constant
from device_sim.runner import SimOptions, Transport, simulate
from device_sim.scenario import single_phase
from device_sim.summary import summarize
from tests.device_sim.conftest import Mosquitto
from tests.device_sim.responders import METADATA, MqttResponder, http_app, serving

SERVICE_S = 0.020
RATE = 50.0
DURATION_S = 4.0
PLANNED = int(RATE * DURATION_S)


async def run_summary(options: SimOptions) -> dict[str, Any]:
    result = await simulate(options, progress=None)
    return summarize(
        result.plan, result.ledger, slo_ms=options.slo_ms, elapsed_s=result.elapsed_s, run={}
    )


def constant_load(transport: Transport, rate: float, duration_s: float, **kw: Any) -> SimOptions:
    return SimOptions(
        transport=transport,
        scenario=single_phase(Constant(rate), duration_s),
        devices=10,
        models=("toy",),
        **kw,
    )


@pytest.fixture
def toy_metadata(tmp_path: Any) -> Any:
    import json

    path = tmp_path / "toy.json"
    path.write_text(json.dumps(METADATA))
    return path


def check_rate_and_latency(summary: dict[str, Any]) -> None:
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
    # Achieved counts replies over [0, max(end, last reply)]: it may fall short of the offered
    # rate only by the last reply's latency, i.e. by well under 3 requests' worth.
    assert RATE - 3 * RATE / PLANNED <= summary["achieved_rps"] <= RATE
    lat = summary["latency_ms"]
    assert lat["min"] >= SERVICE_S * 1000
    assert SERVICE_S * 1000 <= lat["p50"] <= SERVICE_S * 1000 + 15
    assert lat["p50"] <= lat["p95"] <= lat["p99"] <= lat["max"]
    assert sum(row["offered"] for row in summary["timeline"]) == PLANNED
    assert sum(row["ok"] for row in summary["timeline"]) == PLANNED
    # 0.1 s bins for a 4 s run: 5 of the 50 req/s each.
    assert summary["timeline_bin_s"] == 0.1
    assert {row["offered"] for row in summary["timeline"][:40]} == {5}
    assert summary["replies"] == {"late": 0, "duplicate": 0, "unmatched": 0}


@pytest.mark.parametrize("transport", ["mqtt5", "mqtt311"])
async def test_mqtt_rate_and_latency_match_the_responder(
    mosquitto: Mosquitto, toy_metadata: Any, transport: Transport
) -> None:
    async with MqttResponder(mosquitto.port, service_s=SERVICE_S) as responder:
        summary = await run_summary(
            constant_load(
                transport, RATE, DURATION_S, broker=mosquitto.url, metadata_files=(toy_metadata,)
            )
        )
    assert responder.received == PLANNED
    check_rate_and_latency(summary)


async def test_http_rate_and_latency_match_the_server() -> None:
    async with serving(http_app(service_s=SERVICE_S)) as url:
        # No metadata file: the payload is generated from the server's GET /v2/models/toy.
        summary = await run_summary(constant_load("http", RATE, DURATION_S, http_url=url))
    check_rate_and_latency(summary)


@pytest.mark.parametrize("transport", ["mqtt5", "mqtt311"])
async def test_every_dropped_request_is_reported_lost(
    mosquitto: Mosquitto, toy_metadata: Any, transport: Transport
) -> None:
    async with MqttResponder(mosquitto.port, service_s=SERVICE_S, drop_every=10) as responder:
        summary = await run_summary(
            constant_load(
                transport,
                50,
                2.0,
                broker=mosquitto.url,
                metadata_files=(toy_metadata,),
                timeout_s=1.0,
                slo_ms=100,
            )
        )
    assert responder.dropped == 10
    r = summary["requests"]
    assert (r["planned"], r["ok"], r["lost"], r["errors"]) == (100, 90, 10, 0)
    assert sum(row["lost"] for row in summary["timeline"]) == 10
    # A lost request is an SLO violation; the 90 answered in ~20 ms are not.
    assert summary["slo"]["violations"] == 10 + summary["slo"]["late"]
    assert summary["slo"]["late"] <= 2


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
            constant_load("mqtt311", 50, 1.0, broker=mosquitto.url, metadata_files=(toy_metadata,))
        )
    assert summary["requests"]["ok"] == 50
    # The second copy of a reply can only be counted once the first was recorded; allow the
    # last one to race the end of the run.
    assert 49 <= summary["replies"]["duplicate"] <= 50


async def test_the_in_flight_bound_refuses_rather_than_queues(
    mosquitto: Mosquitto, toy_metadata: Any
) -> None:
    # Nothing is ever answered: the first 5 requests fill the bound until they time out at
    # 1 s, after the last of the 20 planned ones, so exactly 15 are refused.
    async with MqttResponder(mosquitto.port, drop_every=1):
        summary = await run_summary(
            constant_load(
                "mqtt5",
                20,
                1.0,
                broker=mosquitto.url,
                metadata_files=(toy_metadata,),
                timeout_s=1.0,
                max_in_flight=5,
                slo_ms=100,
            )
        )
    r = summary["requests"]
    assert (r["planned"], r["sent"], r["lost"], r["not_sent"], r["ok"]) == (20, 5, 5, 15, 0)
    assert summary["errors"] == {}
    assert summary["slo"]["violations"] == 20
