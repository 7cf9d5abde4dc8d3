"""The one seam where the gateway reaches into paho-mqtt's and aiomqtt's private attributes,
for the per-message fast path. Everything private it touches is listed in ``PRIVATE_ATTRIBUTES``
and checked by ``check_paho`` (and by a test), so an upgrade that changes them fails loudly
instead of silently slowing down or breaking the request path. The versions are pinned in
pyproject.toml for the same reason.

What the fast path does, and why:
- incoming MQTT 5 PUBLISHes are parsed by ``wire.parse_publish`` instead of paho's decoder
  (tens of µs of ``Properties`` objects and a lock per request); anything unusual (QoS 2, a
  topic alias, an unknown property, a malformed packet) still goes to paho;
- a reply's PUBACK is routed to the adapter first (it acknowledges the request then), and
  aiomqtt's own handler only gets the publishes it made itself;
- paho asks for a write after every packet it queues, which aiomqtt answers with a thread-safe
  wake-up and an epoll writer each time; here the first packet of an event-loop pass schedules
  one write of everything queued by then (replies and acks together), corked into few segments;
- paho's queue of packets to write has no bound: when a flood is answered (with replies or
  refusals) faster than the broker reads them, more than ``max_unsent`` would wait in it, and
  then reading from the broker stops (``_ReadGate``) until half of them are written. The broker
  holds what is not read, within its own limits, and answered requests' replies stop queueing
  behind an ever longer line of refusals.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

import aiomqtt
import paho.mqtt as paho_package
import paho.mqtt.client as paho

from gateway.mqtt.wire import ReceivedPublish, parse_publish

log = logging.getLogger("gateway.mqtt")

# The releases whose private attributes below were read; pyproject.toml pins these series.
PAHO_SERIES = "2.2."
AIOMQTT_SERIES = "2.5."
PRIVATE_ATTRIBUTES = {
    "aiomqtt.Client": ("_client", "_disconnected"),
    "paho.mqtt.client.Client": ("_handle_publish", "_in_packet", "_out_packet"),
}

Message = paho.MQTTMessage | ReceivedPublish
MessageHandler = Callable[[paho.Client, object, Message], None]
_TCP_CORK: int | None = getattr(socket, "TCP_CORK", None)  # Linux
_RECHECK_S = 0.002  # while reading is paused: how often the write queue is looked at


async def check_paho() -> None:
    """Raise ``RuntimeError`` naming what changed when the installed paho-mqtt or aiomqtt is not
    the series the fast path was written against, or lacks an attribute it uses. (Async: an
    aiomqtt client is made inside a running loop.)"""
    problems = []
    if not paho_package.__version__.startswith(PAHO_SERIES):
        problems.append(f"paho-mqtt {paho_package.__version__} (expected {PAHO_SERIES}x)")
    if not aiomqtt.__version__.startswith(AIOMQTT_SERIES):
        problems.append(f"aiomqtt {aiomqtt.__version__} (expected {AIOMQTT_SERIES}x)")
    problems += _missing_attributes(aiomqtt.Client("127.0.0.1", 1, identifier="iotgw-check"))
    if problems:
        raise RuntimeError("the MQTT fast path does not fit this install: " + "; ".join(problems))


def _missing_attributes(client: aiomqtt.Client) -> list[str]:
    inner = getattr(client, "_client", None)
    missing = []
    for owner, names in PRIVATE_ATTRIBUTES.items():
        obj = client if owner.startswith("aiomqtt") else inner
        missing += [f"{owner}.{name} is gone" for name in names if not hasattr(obj, name)]
    return missing


def install_fast_path(
    client: aiomqtt.Client,
    *,
    v5: bool,
    on_message: MessageHandler,
    on_reply_acked: Callable[[int], bool],
    loop: asyncio.AbstractEventLoop,
    max_unsent: int = 4096,
    on_read_paused: Callable[[], None] = lambda: None,
) -> paho.Client:
    """Wire the fast path into ``client`` before it connects (a persistent session's backlog
    arrives right after the CONNACK, before aiomqtt hands the client over). ``on_reply_acked``
    gets each PUBACK's packet id and says whether it was a reply of the adapter's."""
    missing = _missing_attributes(client)
    if missing:  # refuse to patch what is not there: a clear error beats a silent slow path
        raise RuntimeError("the MQTT fast path does not fit this install: " + "; ".join(missing))
    inner: paho.Client = client._client
    # aiomqtt has no manual-ack option of its own; paho's is the documented way to ack a QoS 1
    # message after it was processed rather than on receipt.
    inner.manual_ack_set(True)
    gate = _ReadGate(client, inner, loop, max_unsent, on_read_paused)

    def received(client: paho.Client, userdata: object, message: Message) -> None:
        # Each request read may add replies: looked at here, because once the socket is full
        # paho stops asking for writes (aiomqtt's writer drains it) and no flush runs.
        gate.check()
        on_message(client, userdata, message)

    inner.on_message = received
    if v5:
        # An instance attribute: paho's packet dispatch calls ``self._handle_publish()``.
        inner._handle_publish = _publish_reader(inner, received)  # type: ignore[method-assign]
    inner.on_publish = _puback_router(on_reply_acked, inner.on_publish)
    inner.on_socket_register_write = _coalesced_writes(
        inner, loop, inner.on_socket_register_write, gate.check
    )
    return inner


def _publish_reader(
    client: paho.Client, on_message: MessageHandler
) -> Callable[[], paho.MQTTErrorCode]:
    paho_reader = client._handle_publish

    def handle_publish() -> paho.MQTTErrorCode:
        packet = client._in_packet
        try:
            message = parse_publish(packet["command"], bytes(packet["packet"]))
        except (ValueError, IndexError, struct.error, UnicodeDecodeError):
            message = None
        if message is None:
            return paho_reader()
        on_message(client, None, message)
        return paho.MQTT_ERR_SUCCESS

    return handle_publish


def _puback_router(
    on_reply_acked: Callable[[int], bool], aiomqtt_on_publish: Callable[..., None] | None
) -> Callable[..., None]:
    def on_publish(
        client: paho.Client, userdata: object, mid: int, reason: Any, props: Any
    ) -> None:
        if not on_reply_acked(mid) and aiomqtt_on_publish is not None:
            aiomqtt_on_publish(client, userdata, mid, reason, props)  # a publish of aiomqtt's

    return on_publish


def _coalesced_writes(
    client: paho.Client,
    loop: asyncio.AbstractEventLoop,
    aiomqtt_register: Callable[..., None] | None,
    after_write: Callable[[], None],
) -> Callable[..., None]:
    assert aiomqtt_register is not None
    loop_thread = threading.get_ident()
    scheduled = False

    def flush() -> None:
        nonlocal scheduled
        scheduled = False
        sock = client.socket()
        # paho sends packet by packet, and with Nagle off each send is a segment the broker
        # wakes up for: corked, a batch's replies (or acks) leave as few segments.
        cork = _TCP_CORK is not None and isinstance(sock, socket.socket)
        cork = cork and len(getattr(client, "_out_packet", ())) > 1
        try:
            if cork:
                sock.setsockopt(socket.IPPROTO_TCP, _TCP_CORK, 1)  # type: ignore[union-attr]
            client.loop_write()
        except Exception as exc:  # aiomqtt's writer reports a broken connection
            log.debug("MQTT: write failed: %s", exc)
        finally:
            if cork:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.IPPROTO_TCP, _TCP_CORK, 0)  # type: ignore[union-attr]
        sock = client.socket()
        if client.want_write() and sock is not None:
            aiomqtt_register(client, None, sock)
        after_write()

    def register(c: paho.Client, userdata: object, sock: Any) -> None:
        nonlocal scheduled
        if threading.get_ident() != loop_thread:
            aiomqtt_register(c, userdata, sock)
        elif not scheduled:
            scheduled = True
            loop.call_soon(flush)

    return register


class _ReadGate:
    """Stops reading from the broker while more than ``high`` packets wait to be written, and
    reads again once no more than half of that do. aiomqtt reads through an event-loop reader
    on the socket: the gate removes it, and puts back one that reads as aiomqtt's does (a
    failed read ends the connection the same way)."""

    def __init__(
        self,
        outer: aiomqtt.Client,
        client: paho.Client,
        loop: asyncio.AbstractEventLoop,
        high: int,
        on_pause: Callable[[], None],
    ) -> None:
        self._outer, self._client, self._loop = outer, client, loop
        self._high = high
        self._on_pause = on_pause
        self._fd: int | None = None  # the socket whose reading is paused

    @property
    def paused(self) -> bool:
        return self._fd is not None

    def check(self) -> None:
        if self._fd is not None or len(self._client._out_packet) <= self._high:
            return
        sock = self._client.socket()
        if sock is None:
            return
        self._fd = sock.fileno()
        self._loop.remove_reader(self._fd)
        self._on_pause()
        log.debug("MQTT: %d packets unsent; reading paused", len(self._client._out_packet))
        self._loop.call_later(_RECHECK_S, self._recheck)

    def _recheck(self) -> None:
        sock = self._client.socket()
        if sock is None or sock.fileno() != self._fd:
            self._fd = None  # the connection is gone: its teardown removed the reader
            return
        if len(self._client._out_packet) > self._high // 2:
            self._loop.call_later(_RECHECK_S, self._recheck)
            return
        self._loop.add_reader(self._fd, self._read)
        self._fd = None

    def _read(self) -> None:
        client = self._client
        try:
            client.loop_read()
            # TLS: bytes already decrypted are not signalled by the socket again.
            pending = getattr(client._sock, "pending", None)
            while pending is not None and pending() > 0:
                client.loop_read()
        except Exception as exc:  # as aiomqtt's reader: a failed read ends the connection
            disconnected: asyncio.Future[None] = self._outer._disconnected
            if not disconnected.done():
                disconnected.set_exception(exc)
