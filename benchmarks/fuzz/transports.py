"""The three ways in: an aiohttp client session, MQTT devices (one MQTT 5 and one MQTT 3.1.1
publisher, QoS 1) with one MQTT 5 receiver subscribed to every reply route the cases use, and a
gRPC channel that sends each case's bytes as they are.

Each ``send`` returns a verdict (see ``judge``) or one of the outcomes below; neither raises for
anything the gateway does."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
import aiomqtt
import grpc
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from yarl import URL

from benchmarks.fuzz.cases import PREFIX, REPLY_ROOT, SEQ, GrpcCase, HttpCase, MqttCase
from benchmarks.fuzz.judge import judge_grpc, judge_http, judge_mqtt, reply_routes

STUCK = "stuck"  # no reply within the timeout
RESET = "reset"  # the HTTP connection closed without a response
DOWN = "down"  # the gateway refused the connection (not running)
UNROUTED = "unrouted"  # published where no reply is owed: nothing to wait for
_QUIET = logging.getLogger("benchmarks.fuzz.mqtt")
_QUIET.setLevel(logging.ERROR)
_NODELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]


async def send_http(
    session: aiohttp.ClientSession, base: str, case: HttpCase, timeout_s: float
) -> tuple[str, str]:
    url = URL(base + case.path, encoded=True)  # the path is sent as written, %-escapes and all
    try:
        async with session.post(
            url,
            data=case.body,
            headers=dict(case.headers),
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as resp:
            body = await resp.read()
            headers = {k.lower(): v for k, v in resp.headers.items()}
            return judge_http(resp.status, body, headers, tfs=":predict" in case.path)
    except TimeoutError:
        return STUCK, f"no HTTP response in {timeout_s:g} s"
    except aiohttp.ClientConnectorError as exc:
        return DOWN, str(exc)
    except (
        aiohttp.ServerDisconnectedError,
        aiohttp.ClientPayloadError,
        aiohttp.ClientOSError,
    ) as e:
        return RESET, f"{type(e).__name__}: {e}"


async def send_grpc(channel: grpc.aio.Channel, case: GrpcCase, timeout_s: float) -> tuple[str, str]:
    # No serializers: the case's bytes go on the wire as drawn, the reply comes back as bytes.
    call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(case.method)
    try:
        reply = await call(case.body, timeout=timeout_s)
    except grpc.aio.AioRpcError as err:
        code = err.code()
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return STUCK, f"no gRPC answer in {timeout_s:g} s"
        details = err.details() or ""
        trailers = dict(err.trailing_metadata() or ())
        reason = trailers.get("iotgw-reason")
        if code == grpc.StatusCode.UNAVAILABLE and reason is None:
            return DOWN, details  # the connection, not the gateway's answer
        return judge_grpc(code.name, details, str(reason) if reason else None, b"", case.method)
    return judge_grpc("OK", "", None, reply, case.method)


@dataclass
class _Waiter:
    future: asyncio.Future[tuple[str, str]]
    routes: list[str]


@dataclass
class MqttDevices:
    """Publishers and the reply receiver on one broker; replies are matched by topic (every
    request has its own device and Response Topic, see ``cases``)."""

    port: int
    waiting: dict[str, _Waiter] = field(default_factory=dict)
    late_replies: int = 0
    _v5: aiomqtt.Client | None = None
    _v311: aiomqtt.Client | None = None

    @contextlib.asynccontextmanager
    async def connected(self) -> AsyncIterator[MqttDevices]:
        def client(name: str, protocol: aiomqtt.ProtocolVersion) -> aiomqtt.Client:
            return aiomqtt.Client(
                "127.0.0.1",
                self.port,
                identifier=f"fuzz-{name}",
                protocol=protocol,
                max_inflight_messages=1000,
                logger=_QUIET,  # not a warning per publish beyond ten outstanding
                socket_options=_NODELAY,
            )

        v5, v311 = aiomqtt.ProtocolVersion.V5, aiomqtt.ProtocolVersion.V311
        async with (
            client("receiver", v5) as receiver,
            client("v5", v5) as self._v5,
            client("v311", v311) as self._v311,
            asyncio.TaskGroup() as tasks,
        ):
            await receiver.subscribe(f"{REPLY_ROOT}/#", qos=1)
            await receiver.subscribe(f"{PREFIX}/infer/+/res/#", qos=1)
            reader = tasks.create_task(self._receive(receiver))
            try:
                yield self
            finally:
                reader.cancel()

    async def _receive(self, receiver: aiomqtt.Client) -> None:
        async for message in receiver.messages:
            waiter = self.waiting.get(str(message.topic))
            if waiter is None or waiter.future.done():
                self.late_replies += 1
                continue
            props = message.properties
            status = dict(getattr(props, "UserProperty", None) or ()).get("status")
            payload = message.payload if isinstance(message.payload, bytes) else b""
            waiter.future.set_result(judge_mqtt(payload, status))

    async def send(self, case: MqttCase, n: int, timeout_s: float) -> tuple[str, str]:
        topic = case.topic.replace(SEQ, str(n))
        response_topic = (
            None if case.response_topic is None else case.response_topic.replace(SEQ, str(n))
        )
        routes = reply_routes(topic, case.v5, response_topic)
        waiter = _Waiter(asyncio.get_running_loop().create_future(), routes)
        for route in routes:
            self.waiting[route] = waiter
        try:
            client = self._v5 if case.v5 else self._v311
            assert client is not None
            props = _properties(case, n, response_topic) if case.v5 else None
            await client.publish(topic, case.payload, qos=1, properties=props, timeout=timeout_s)
            if not routes:
                return UNROUTED, "no reply owed"
            return await asyncio.wait_for(waiter.future, timeout_s)
        except TimeoutError:
            return STUCK, f"no MQTT reply in {timeout_s:g} s on {[r[:100] for r in routes]}"
        finally:
            for route in routes:
                self.waiting.pop(route, None)


def _properties(case: MqttCase, n: int, response_topic: str | None) -> Properties | None:
    props = Properties(PacketTypes.PUBLISH)
    if response_topic is not None:
        props.ResponseTopic = response_topic
    if case.correlation is not None:
        props.CorrelationData = b"%d:" % n + case.correlation
    if case.content_type is not None:
        props.ContentType = case.content_type
    if case.expiry_s is not None:
        props.MessageExpiryInterval = case.expiry_s
    if case.user_properties:
        props.UserProperty = list(case.user_properties)
    return props
