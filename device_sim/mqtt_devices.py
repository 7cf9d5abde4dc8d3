"""Virtual devices that send inference requests over MQTT (docs/mqtt.md).

An ``MqttLink`` is one client connection (one client id) carrying the traffic of one or more
devices; by default every device gets its own link, as real devices would. Devices publish to
``<prefix>/infer/<model>/req/<device_id>`` and wait for the reply:

- MQTT 5: Response Topic ``<prefix>/infer/<model>/res/<device_id>`` and Correlation Data (the
  request id); the reply is matched by its echoed Correlation Data.
- MQTT 3.1.1: the gateway replies on that same ``res`` topic and the reply is matched by the
  request's JSON ``id``.

One subscription per device, ``<prefix>/infer/+/res/<device_id>``, catches both.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from device_sim.endpoints import BrokerAddress
from device_sim.ledger import Outcome, Result
from device_sim.wire import Reply, RequestBody, error_kind, parse_reply

MqttVersion = Literal["5", "3.1.1"]
# Nagle's algorithm holds a small publish until the previous one is acknowledged: a QoS 1
# request/reply then stalls 40-90 ms. Every device socket turns it off.
TCP_NODELAY: aiomqtt.types.SocketOption = (socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


@dataclass(frozen=True, slots=True)
class MqttOptions:
    broker: BrokerAddress
    version: MqttVersion = "5"
    qos: int = 1
    prefix: str = "iotgw"
    keepalive_s: int = 30
    connect_timeout_s: float = 10.0


def request_topic(prefix: str, model: str, device_id: str) -> str:
    return f"{prefix}/infer/{model}/req/{device_id}"


def reply_topic(prefix: str, model: str, device_id: str) -> str:
    return f"{prefix}/infer/{model}/res/{device_id}"


@functools.cache
def _tls_context() -> ssl.SSLContext:
    # Loading the CA store takes tens of milliseconds: once per process, not once per device.
    return ssl.create_default_context()


def new_client(options: MqttOptions, client_id: str) -> aiomqtt.Client:
    """An aiomqtt client for ``options`` (not yet connected), TCP_NODELAY set on its socket."""
    broker = options.broker
    return aiomqtt.Client(
        broker.host,
        broker.port,
        identifier=client_id,
        protocol=(
            aiomqtt.ProtocolVersion.V5 if options.version == "5" else aiomqtt.ProtocolVersion.V311
        ),
        username=broker.username,
        password=broker.password,
        tls_context=_tls_context() if broker.tls else None,
        keepalive=options.keepalive_s,
        timeout=options.connect_timeout_s,
        socket_options=[TCP_NODELAY],
    )


class MqttLink:
    """One MQTT connection serving ``device_ids``; use as an async context manager."""

    def __init__(
        self,
        options: MqttOptions,
        client_id: str,
        device_ids: list[str],
        on_unmatched: Callable[[str | None], None] = lambda rid: None,
    ) -> None:
        self.options = options
        self.client_id = client_id
        self.device_ids = device_ids
        self._on_unmatched = on_unmatched
        self._client: aiomqtt.Client | None = None
        self._pending: dict[str, asyncio.Future[tuple[float, Reply]]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._closed_reason: str | None = None

    @property
    def client(self) -> aiomqtt.Client:
        assert self._client is not None, "the link is not connected"
        return self._client

    async def __aenter__(self) -> MqttLink:
        self._client = new_client(self.options, self.client_id)
        await self._client.__aenter__()
        try:
            prefix, qos = self.options.prefix, self.options.qos
            # One SUBSCRIBE for all of this link's devices; it completes before any request
            # is sent, so no early reply can miss its subscription.
            await self._client.subscribe(
                [(reply_topic(prefix, "+", d), qos) for d in self.device_ids]
            )
        except BaseException:
            await self._client.__aexit__(None, None, None)
            raise
        self._reader = asyncio.create_task(self._read_replies(), name=f"replies-{self.client_id}")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._client is not None:
            with contextlib.suppress(aiomqtt.MqttError):
                await self._client.__aexit__(None, None, None)

    async def _read_replies(self) -> None:
        try:
            async for message in self.client.messages:
                received = time.perf_counter()
                payload = message.payload
                if not isinstance(payload, bytes | bytearray):
                    payload = str(payload).encode()
                status_property, correlation = None, None
                if message.properties is not None:
                    correlation = getattr(message.properties, "CorrelationData", None)
                    for key, value in getattr(message.properties, "UserProperty", []):
                        if key == "status":
                            status_property = value
                reply = parse_reply(bytes(payload), status_property)
                rid = correlation.decode(errors="replace") if correlation else reply.id
                future = self._pending.pop(rid, None) if rid is not None else None
                if future is None or future.done():
                    self._on_unmatched(rid)
                else:
                    future.set_result((received, reply))
        except aiomqtt.MqttError as exc:
            # The broker went away: every waiting request fails now rather than at its timeout.
            self._closed_reason = f"disconnected: {exc}"
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(ConnectionError(self._closed_reason))
            self._pending.clear()

    async def request(
        self, device_id: str, model: str, body: RequestBody, request_id: str, timeout_s: float
    ) -> Result:
        opts = self.options
        future: asyncio.Future[tuple[float, Reply]] = asyncio.get_running_loop().create_future()
        properties = None
        if opts.version == "5":
            properties = Properties(PacketTypes.PUBLISH)
            properties.ResponseTopic = reply_topic(opts.prefix, model, device_id)
            properties.CorrelationData = request_id.encode()
            properties.ContentType = body.content_type
        payload = body.mqtt(request_id)
        # Registered before publishing: the reply can overtake the PUBACK.
        self._pending[request_id] = future
        sent = time.perf_counter()
        try:
            async with asyncio.timeout(timeout_s):
                if self._closed_reason is not None:
                    raise ConnectionError(self._closed_reason)
                await self.client.publish(
                    request_topic(opts.prefix, model, device_id),
                    payload,
                    qos=opts.qos,
                    properties=properties,
                    # The request's own deadline (asyncio.timeout above) decides; aiomqtt's
                    # separate publish timeout would report a slow PUBACK as an error, not a loss.
                    timeout=math.inf,
                )
                received, reply = await future
        except TimeoutError:
            return Result(Outcome.LOST, sent)
        except (aiomqtt.MqttError, ConnectionError):
            return Result(Outcome.ERROR, sent, time.perf_counter(), 0, "transport")
        finally:
            self._pending.pop(request_id, None)
        if reply.status == 200:
            return Result(Outcome.OK, sent, received, 200)
        kind = error_kind(reply.status, reply.reason)
        return Result(Outcome.ERROR, sent, received, reply.status, kind)


class MqttDevice:
    """A device id bound to the link that carries its traffic."""

    def __init__(self, device_id: str, link: MqttLink) -> None:
        self.device_id = device_id
        self.link = link

    async def request(
        self, model: str, body: RequestBody, request_id: str, timeout_s: float
    ) -> Result:
        return await self.link.request(self.device_id, model, body, request_id, timeout_s)
