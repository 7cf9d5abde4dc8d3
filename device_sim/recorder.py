"""``iotgw sim record``: capture the inference requests crossing a broker into a trace.

The recorder subscribes to ``<prefix>/infer/+/req/+`` with a plain (not shared) subscription, so
it sees every request without taking a share of them away from the gateway. Each request becomes
a trace entry; its payload is saved once per distinct content under ``<trace stem>.payloads/``
(named by a hash of its content apart from the request id, which the replayer replaces anyway),
so a fleet sending the same reading costs one file. Offsets are
counted from the first captured request. Recording stops after ``duration_s`` or ``max_count``
requests, whichever comes first.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TextIO

from device_sim.endpoints import BrokerAddress
from device_sim.mqtt_devices import MqttOptions, new_client
from device_sim.mqtt_version import VersionChoice, negotiate_version
from device_sim.trace import TraceEntry, TraceWriter
from device_sim.wire import OipBody, body_from_payload


@dataclass(frozen=True, slots=True)
class RecordOptions:
    broker: BrokerAddress
    trace: Path
    prefix: str = "iotgw"
    duration_s: float = 60.0
    max_count: int = 100_000
    version: VersionChoice = "auto"
    """auto: MQTT 5 when the broker accepts it, else 3.1.1."""
    qos: int = 1
    client_id: str = "iotgw-sim-recorder"


# A recording runs for a minute by default: a line this often says it is alive and counting.
PROGRESS_EVERY_S = 5.0


def payload_dir(trace: Path) -> Path:
    return trace.with_name(trace.stem + ".payloads")


def parse_request_topic(prefix: str, topic: str) -> tuple[str, str] | None:
    """(model, device) of ``<prefix>/infer/<model>/req/<device>``, else None."""
    if not topic.startswith(prefix + "/"):
        return None
    levels = topic[len(prefix) + 1 :].split("/")
    if len(levels) != 4 or levels[0] != "infer" or levels[2] != "req":
        return None
    return levels[1], levels[3]


def content_digest(payload: bytes) -> str:
    """A name for the payload's content apart from its request id: the replayer sets a fresh id
    on every request anyway, so payloads differing only in their id share one file."""
    body = body_from_payload(payload)
    content = body.header_rest + body.tensors if isinstance(body, OipBody) else payload
    return hashlib.sha256(content).hexdigest()[:20]


def start_line(options: RecordOptions, version: str) -> str:
    return (
        f"iotgw sim record: recording the requests on {options.prefix}/infer/+/req/+ at "
        f"{options.broker} (MQTT {version}) into {options.trace}, for {options.duration_s:g} s "
        f"or {options.max_count:,} requests, whichever comes first"
    )


async def _report_progress(
    count: list[int], stream: TextIO, every_s: float = PROGRESS_EVERY_S
) -> None:
    """Every ``every_s``: the requests recorded so far and the rate of the last interval."""
    origin, last, tick = time.perf_counter(), 0, 1
    while True:
        await asyncio.sleep(max(0.0, origin + tick * every_s - time.perf_counter()))
        recent = (count[0] - last) / every_s
        print(
            f"iotgw sim record: [{tick * every_s:5.0f}s] {count[0]:,} requests recorded "
            f"({recent:.1f}/s in the last {every_s:g} s)",
            file=stream,
            flush=True,
        )
        last, tick = count[0], tick + 1


async def record(
    options: RecordOptions,
    ready: asyncio.Event | None = None,
    progress: TextIO | None = None,
    progress_every_s: float = PROGRESS_EVERY_S,
) -> int:
    """Record until the duration or count bound; return the number of requests captured.
    ``ready`` is set once the subscription is in place (requests before that are not seen);
    ``progress`` gets a line then, and one every ``progress_every_s`` while it records."""
    payloads = payload_dir(options.trace)
    payloads.mkdir(parents=True, exist_ok=True)
    saved: set[str] = set()
    count = [0]  # shared with the progress task
    first: float | None = None
    mqtt = MqttOptions(options.broker, qos=options.qos, prefix=options.prefix)
    version = await negotiate_version(mqtt, options.version, option_for_311="--protocol 3.1.1")
    mqtt = replace(mqtt, version=version)
    async with new_client(mqtt, options.client_id) as client:
        await client.subscribe(f"{options.prefix}/infer/+/req/+", qos=options.qos)
        if ready is not None:
            ready.set()
        reporter = None
        if progress is not None:
            print(start_line(options, version), file=progress, flush=True)
            reporter = asyncio.create_task(_report_progress(count, progress, progress_every_s))
        with TraceWriter(options.trace) as writer:
            try:
                async with asyncio.timeout(options.duration_s):
                    async for message in client.messages:
                        now = time.perf_counter()
                        where = parse_request_topic(options.prefix, message.topic.value)
                        if where is None:
                            continue
                        payload = message.payload
                        if not isinstance(payload, bytes | bytearray):
                            payload = str(payload).encode()
                        digest = content_digest(bytes(payload))
                        ref = f"{payloads.name}/{digest}.bin"
                        if digest not in saved:
                            # A small write on the loop is fine: the recorder runs nothing else.
                            (payloads / f"{digest}.bin").write_bytes(payload)
                            saved.add(digest)
                        first = now if first is None else first
                        writer.write(TraceEntry(now - first, where[1], where[0], ref))
                        count[0] += 1
                        if count[0] >= options.max_count:
                            break
            except TimeoutError:
                pass  # the duration bound: a normal end
            finally:
                if reporter is not None:
                    reporter.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await reporter
    return count[0]
