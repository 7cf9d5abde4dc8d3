"""The pieces between the serving process and its ingest processes, in one process: the frames
on a real Unix socket, the catalog that must refuse exactly as the service refuses, and what an
ingest process answers when the serving process goes away."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from gateway.errors import GatewayError, NotFound
from gateway.ingest import counts, frames
from gateway.ingest.remote import RemoteService, ServingGone
from gateway.metrics import GatewayMetrics
from gateway.types import InferenceRequest, InferenceResponse
from gateway.versions import Catalog
from tests.gateway.helpers import make_repo, running_gateway

pytestmark = pytest.mark.asyncio(loop_scope="function")


class Peer:
    def __init__(self) -> None:
        self.got: list[tuple[object, ...]] = []
        self.inference = asyncio.Event()  # set when an INFER message arrived


@contextlib.asynccontextmanager
async def unix_peer(
    path: Path, script: asyncio.Queue[tuple[object, ...] | None]
) -> AsyncIterator[Peer]:
    """A serving side that sends what ``script`` yields (None: close) and records what it got."""
    peer = Peer()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async def record() -> None:
            while (message := await frames.read(reader)) is not None:
                peer.got.append(message)
                if message[0] == frames.INFER:
                    peer.inference.set()

        recorder = asyncio.create_task(record())
        while (message := await script.get()) is not None:
            writer.write(frames.encode(message))
        writer.close()
        recorder.cancel()

    server = await asyncio.start_unix_server(serve, path=str(path))
    try:
        yield peer
    finally:
        server.close()


async def test_frames_round_trip_requests_with_tensors(tmp_path: Path) -> None:
    request = InferenceRequest(
        model="m", inputs={"x": np.arange(12, dtype=np.float32).reshape(3, 4)}, id="a", version=2
    )
    reader = asyncio.StreamReader()
    reader.feed_data(frames.encode((frames.INFER, 7, request, "http")))
    reader.feed_eof()
    message = await frames.read(reader)
    assert message is not None
    kind, seq, back, transport = message
    assert (kind, seq, transport) == (frames.INFER, 7, "http")
    assert (back.model, back.id, back.version) == ("m", "a", 2)
    np.testing.assert_array_equal(back.inputs["x"], request.inputs["x"])
    assert await frames.read(reader) is None  # a clean end


async def test_frames_refuse_a_cut_or_oversize_frame() -> None:
    whole = frames.encode((frames.LIVE, {"http": True}))
    reader = asyncio.StreamReader()
    reader.feed_data(whole[:-2])
    reader.feed_eof()
    with pytest.raises(frames.FrameError, match="inside a frame"):
        await frames.read(reader)
    reader = asyncio.StreamReader()
    reader.feed_data((frames.MAX_FRAME_BYTES + 1).to_bytes(4, "big"))
    with pytest.raises(frames.FrameError, match="exceeds"):
        await frames.read(reader)


async def test_catalog_refuses_exactly_as_the_service(demo_repo: Path, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", demo_repo, {"sensor_mlp": None, "sensor_fusion": None})
    (repo / "broken" / "1").mkdir(parents=True)  # a version that cannot be read
    (repo / "broken" / "1" / "config.toml").write_text("not toml [", encoding="utf-8")
    async with running_gateway(repo, tmp_path / "cache") as gw:
        service = gw.service
        catalog = service.registry.catalog()
        queries = [
            ("sensor_mlp", None),
            ("sensor_mlp", "1"),
            ("sensor_mlp", 1),
            ("sensor_mlp", "9"),
            ("sensor_mlp", "x"),
            ("sensor_fusion", None),
            ("broken", None),
            ("broken", "1"),
            ("nope", None),
            ("nope", "1"),
        ]
        outcomes = 0
        for model, version in queries:
            want = _outcome(lambda m=model, v=version: service.metadata(m, v))
            got = _outcome(lambda m=model, v=version: catalog.metadata(m, v))
            assert got == want, (model, version)
            outcomes += isinstance(want, tuple)
        assert outcomes == 6  # the refusals compared are real ones
        await service.registry.unload_model("sensor_fusion")  # an operator unloads it
        catalog = service.registry.catalog()
        for version in (None, "1"):
            want = _outcome(lambda v=version: service.metadata("sensor_fusion", v))
            assert isinstance(want, tuple) and "unloaded" in want[2]
            assert _outcome(lambda v=version: catalog.metadata("sensor_fusion", v)) == want


def _outcome(call: object) -> object:
    try:
        return call()  # type: ignore[operator]
    except GatewayError as exc:
        return (type(exc).__name__, exc.status, exc.message)


async def test_an_empty_catalog_refuses_unknown_models() -> None:
    with pytest.raises(NotFound, match="unknown model 'm'"):
        Catalog().check_model("m")


async def test_pending_requests_get_503_when_the_serving_process_goes(tmp_path: Path) -> None:
    script: asyncio.Queue[tuple[object, ...] | None] = asyncio.Queue()
    await script.put((frames.CATALOG, Catalog(), {"internal_url": "http://127.0.0.1:1"}))
    path = tmp_path / "s.sock"
    async with unix_peer(path, script) as peer:
        remote = RemoteService(index=3)
        await remote.connect(str(path))
        request = InferenceRequest(model="m", inputs={"x": np.zeros((1, 2), np.float32)})
        pending = asyncio.ensure_future(remote.infer(request, transport="mqtt"))
        await asyncio.wait_for(peer.inference.wait(), 10)
        await script.put(None)  # the serving process goes away with the request unanswered
        with pytest.raises(ServingGone) as refused:
            await pending
        assert refused.value.status == 503 and refused.value.retry_after == 1
        await asyncio.wait_for(remote.closed.wait(), 10)
        with pytest.raises(ServingGone):  # and later ones are refused at once
            await remote.infer(request, transport="mqtt")
        await remote.close()
    assert peer.got[0] == (frames.HELLO, 3, os.getpid())


async def test_refusals_come_back_as_the_same_error(tmp_path: Path) -> None:
    script: asyncio.Queue[tuple[object, ...] | None] = asyncio.Queue()
    await script.put((frames.CATALOG, Catalog(), {}))
    path = tmp_path / "s.sock"
    async with unix_peer(path, script) as peer:
        remote = RemoteService(index=0)
        await remote.connect(str(path))
        request = InferenceRequest(model="m", inputs={"x": np.zeros((1, 2), np.float32)})
        pending = asyncio.ensure_future(remote.infer(request, transport="http"))
        await asyncio.wait_for(peer.inference.wait(), 10)
        seq = next(m[1] for m in peer.got if m[0] == frames.INFER)
        await script.put((frames.ERROR, seq, "Overloaded", "queue of m is full", 0.5))
        with pytest.raises(GatewayError) as refused:
            await pending
        assert type(refused.value).__name__ == "Overloaded"
        assert (refused.value.status, refused.value.reason) == (503, "queue_full")
        assert refused.value.retry_after == 0.5
        await script.put(None)
        await remote.close()


async def test_counter_increments_travel_and_add_up() -> None:
    worker, serving = GatewayMetrics(), GatewayMetrics()
    worker.error_replies.labels("mqtt", "bad_request").inc(3)
    worker.mqtt_duplicates.inc()
    sent_first = counts.totals(worker)
    first = counts.increments(sent_first, {})
    worker.error_replies.labels("mqtt", "bad_request").inc(2)
    second = counts.increments(counts.totals(worker), sent_first)
    assert second == {"iotgw_error_replies": {("mqtt", "bad_request"): 2.0}}  # only what grew
    serving_counters = counts.counters_by_name(serving)
    unknown: counts.Counts = {"iotgw_unknown": {(): 5.0}}
    for message in (first, second, unknown):  # an unknown counter is ignored
        counts.add(serving_counters, message)
    text = serving.render().decode()
    assert 'iotgw_error_replies_total{reason="bad_request",transport="mqtt"} 5.0' in text
    assert "iotgw_mqtt_duplicates_total 1.0" in text


async def test_replies_and_byte_tensors_round_trip() -> None:
    strings = np.array([b"on", b"off"], dtype=object)
    for message in (
        (frames.REPLY, 3, InferenceResponse("m", 1, {"y": np.ones((2, 3), np.float16)}, "r")),
        (frames.INFER, 4, InferenceRequest(model="m", inputs={"s": strings}), "mqtt"),
    ):
        back = frames.decode(frames.encode(message)[4:])
        assert back[:2] == message[:2]
        sent, got = message[2], back[2]
        tensors = "outputs" if message[0] == frames.REPLY else "inputs"
        for name, array in getattr(sent, tensors).items():
            assert getattr(got, tensors)[name].dtype == array.dtype
            np.testing.assert_array_equal(getattr(got, tensors)[name], array)


async def test_a_frame_of_unknown_form_or_extra_bytes_is_refused() -> None:
    with pytest.raises(frames.FrameError, match="unknown frame form"):
        frames.decode(b"Z123")
    request = InferenceRequest(model="m", inputs={"x": np.zeros((1, 2), np.float32)})
    body = frames.encode((frames.INFER, 1, request, "http"))[4:]
    with pytest.raises(frames.FrameError, match="beyond its tensors"):
        frames.decode(body + b"\0\0\0\0")
