"""``record`` captures the requests crossing a broker into a trace that replays them."""

from __future__ import annotations

import asyncio
import io
import json
import re
import time
from collections import Counter
from pathlib import Path

import aiomqtt
import numpy as np
import pytest

from device_sim.arrivals import Constant
from device_sim.endpoints import BrokerAddress
from device_sim.recorder import RecordOptions, payload_dir, record
from device_sim.runner import SimOptions, simulate
from device_sim.scenario import single_phase
from device_sim.trace import read_trace
from device_sim.wire import OipBody, body_from_payload
from tests.device_sim.conftest import Mosquitto
from tests.device_sim.responders import METADATA, MqttResponder


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
async def test_record_captures_n_requests_and_the_trace_replays_them(
    mosquitto: Mosquitto, tmp_path: Path, suffix: str
) -> None:
    metadata = tmp_path / "toy.json"
    metadata.write_text(json.dumps(METADATA))
    trace = tmp_path / f"capture{suffix}"
    ready = asyncio.Event()
    options = RecordOptions(BrokerAddress.parse(mosquitto.url), trace, max_count=30, duration_s=20)
    async with MqttResponder(mosquitto.port, service_s=0.002):
        recording = asyncio.create_task(record(options, ready))
        await asyncio.wait_for(ready.wait(), 10)
        sent = await simulate(
            SimOptions(
                broker=mosquitto.url,
                scenario=single_phase(Constant(30), 1.0),
                devices=4,
                models=("toy",),
                metadata_files=(metadata,),
                binary=True,
            ),
            progress=None,
        )
        assert await asyncio.wait_for(recording, 10) == 30

    entries = read_trace(trace)
    assert len(entries) == 30
    assert entries[0].t == 0.0
    # Each device publishes on its own connection, so the broker may interleave devices whose
    # sends fall close together (a loaded machine bunches them); each request is there once.
    recorded = [e.device for e in entries]
    assert Counter(recorded) == Counter(sent.plan.devices[d] for d in sent.plan.device)
    assert [e.t for e in entries] == sorted(e.t for e in entries)
    assert {e.model for e in entries} == {"toy"}
    # The trace keeps the timing of the sends as they happened (a busy machine's late sends
    # too): its span is the span of the send times the simulator recorded, up to the broker's
    # delivery jitter.
    sent_at = sent.ledger.sent_at[np.isfinite(sent.ledger.sent_at)]
    assert entries[-1].t == pytest.approx(float(sent_at.max() - sent_at.min()), abs=0.5)
    # Payloads are saved once per distinct content (16 distinct bodies in the pool).
    files = list(payload_dir(trace).iterdir())
    assert len(files) == len({e.payload for e in entries}) <= 16
    body = body_from_payload((trace.parent / entries[0].payload).read_bytes())  # type: ignore[operator]
    assert isinstance(body, OipBody) and body.binary

    async with MqttResponder(mosquitto.port, service_s=0.002) as responder:
        replay = await simulate(
            SimOptions(transport="mqtt311", broker=mosquitto.url, trace=trace, speed=4.0),
            progress=None,
        )
    assert replay.ledger.counters.ok == 30
    assert responder.binary_requests == 30  # the recorded payloads, not generated ones
    assert sorted(responder.seen.elements()) == sorted(e.device for e in entries)
    assert replay.plan.duration_s == pytest.approx(entries[-1].t / 4 * 30 / 29)


async def test_record_stops_at_its_duration(mosquitto: Mosquitto, tmp_path: Path) -> None:
    trace = tmp_path / "empty.csv"
    started = time.monotonic()
    count = await record(RecordOptions(BrokerAddress.parse(mosquitto.url), trace, duration_s=0.5))
    assert count == 0
    assert time.monotonic() - started < 5
    assert trace.read_text().splitlines() == ["t,device,model,payload"]


async def test_record_says_it_started_and_counts_as_it_goes(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    """A recording of a minute must not be a minute of silence."""
    trace = tmp_path / "rec.csv"
    options = RecordOptions(BrokerAddress.parse(mosquitto.url), trace, duration_s=1.1)
    stream = io.StringIO()
    ready = asyncio.Event()
    recording = asyncio.create_task(record(options, ready, progress=stream, progress_every_s=0.25))
    await asyncio.wait_for(ready.wait(), 10)
    async with aiomqtt.Client(mosquitto.host, mosquitto.port) as client:
        for i in range(3):
            await client.publish(f"iotgw/infer/toy/req/dev{i}", b'{"id": "x"}', qos=1)
    assert await asyncio.wait_for(recording, 10) == 3
    start, *ticks = stream.getvalue().splitlines()
    assert start == (
        f"iotgw sim record: recording the requests on iotgw/infer/+/req/+ at "
        f"mqtt://127.0.0.1:{mosquitto.port} (MQTT 5) into {trace}, for 1.1 s or 100,000 "
        "requests, whichever comes first"
    )
    assert len(ticks) >= 3, ticks  # every 0.25 s of the 1.1 s (a loaded machine may miss one)
    assert all(
        re.fullmatch(r"iotgw sim record: \[ +\d+s\] \d+ requests recorded .*", t) for t in ticks
    )
    assert ticks[-1].split("] ")[1].startswith("3 requests recorded"), ticks
