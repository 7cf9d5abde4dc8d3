"""The broker session: connect (a persistent session, Receive Maximum, Maximum Packet Size,
TCP_NODELAY), subscribe (shared where the broker grants it), notice the connection's loss, and
reconnect with jittered exponential backoff until stopped. aiomqtt owns the connection's life;
what arrives on it is the request flow's (``SessionHandler``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from gateway.settings.schema import MqttSettings

log = logging.getLogger("gateway.mqtt")

_SHARED_NOT_SUPPORTED = 0x9E


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    host: str
    port: int
    tls: bool

    @classmethod
    def parse(cls, url: str) -> BrokerAddress:
        parts = urlsplit(url if "://" in url else f"mqtt://{url}")
        if parts.scheme not in ("mqtt", "mqtts", "tcp", "ssl"):
            raise ValueError(f"broker URL {url!r}: scheme must be mqtt:// or mqtts://")
        tls = parts.scheme in ("mqtts", "ssl")
        if not parts.hostname:
            raise ValueError(f"broker URL {url!r} has no host")
        return cls(parts.hostname, parts.port or (8883 if tls else 1883), tls)


class SessionHandler(Protocol):
    """What the session asks of the request flow."""

    def attach(self, client: aiomqtt.Client) -> None:
        """A new client, before it connects: install the message path."""

    async def detach(self) -> None:
        """Its connection is gone: release what was taken on it."""

    async def drain(self) -> None:
        """Stopping: answer what was taken (bounded by the drain timeout)."""


class BrokerSession:
    def __init__(
        self,
        *,
        settings: MqttSettings,
        address: BrokerAddress,
        v5: bool,
        request_filter: str,
        handler: SessionHandler,
        on_reconnect: Callable[[], None],
    ) -> None:
        self._settings = settings
        self._address = address
        self._v5 = v5
        self._filter = request_filter
        self._handler = handler
        self._on_reconnect = on_reconnect
        self.connected = asyncio.Event()
        self.subscribed_topic: str | None = None

    async def run(self, stopping: asyncio.Event) -> None:
        """Connect, serve, and reconnect with exponential backoff until ``stopping``."""
        delay = self._settings.reconnect_min_s
        while not stopping.is_set():
            try:
                client = self._new_client()
                self._handler.attach(client)
                async with client:
                    delay = self._settings.reconnect_min_s
                    await self._subscribe(client)
                    self.connected.set()
                    log.info(
                        "MQTT: connected to %s:%d (MQTT %s), subscribed to %s",
                        self._address.host,
                        self._address.port,
                        "5" if self._v5 else "3.1.1",
                        self.subscribed_topic,
                    )
                    if await self._serve_until_stopped(client, stopping):
                        return
            except aiomqtt.MqttError as exc:
                log.warning(
                    "MQTT: connection to %s:%d lost or refused (%s); retrying in %.1f s",
                    self._address.host,
                    self._address.port,
                    exc,
                    delay,
                )
            except Exception:
                # Anything else is a bug or a bad setting; HTTP keeps serving meanwhile.
                log.exception("MQTT: adapter failed; retrying in %.1f s", delay)
            finally:
                # Readiness turns 503 at once, not after the taken requests finished.
                self.connected.clear()
                await self._handler.detach()
            with contextlib.suppress(TimeoutError):  # jitter spreads replicas' reconnects
                await asyncio.wait_for(stopping.wait(), delay * (0.5 + random.random()))
            delay = min(delay * 2, self._settings.reconnect_max_s)
            if not stopping.is_set():
                self._on_reconnect()

    async def _serve_until_stopped(self, client: aiomqtt.Client, stopping: asyncio.Event) -> bool:
        """Serve until the connection fails (raises) or ``stopping`` (returns True after the
        handler answered every request already taken, so none waits for a redelivery)."""
        # Requests arrive through the paho callbacks; aiomqtt's message stream stays empty and
        # only tells us when the connection is gone.
        watcher = asyncio.create_task(_until_disconnected(client), name="mqtt-watch")
        stop = asyncio.create_task(stopping.wait())
        try:
            await asyncio.wait({watcher, stop}, return_when=asyncio.FIRST_COMPLETED)
            if stopping.is_set() and not watcher.done():
                await self._handler.drain()
                return True
        finally:
            stop.cancel()
            if not watcher.done():
                watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher  # re-raises the connection error, if that is why it ended
        return True

    def _new_client(self) -> aiomqtt.Client:
        s = self._settings
        properties: Properties | None = None
        if self._v5:
            properties = Properties(PacketTypes.CONNECT)
            properties.SessionExpiryInterval = s.session_expiry_s
            properties.ReceiveMaximum = s.receive_maximum
            # The broker never sends us a packet above this (it drops it instead): what a
            # device can make the gateway read into memory. Twice the payload limit, so a
            # payload over the limit by less than that still gets its 413 error reply.
            properties.MaximumPacketSize = 2 * s.max_payload_bytes + 65536
        tls_context: ssl.SSLContext | None = None
        if self._address.tls:
            tls_context = ssl.create_default_context(cafile=s.ca_file)
            if s.cert_file is not None:
                tls_context.load_cert_chain(s.cert_file, s.key_file)
        # MQTT 5 spells a persistent session as clean_start=False (clean_session is 3.1.1's).
        v5_session: dict[str, Any] = {"clean_start": False} if self._v5 else {}
        return aiomqtt.Client(
            self._address.host,
            self._address.port,
            identifier=s.client_id,
            username=s.username,
            password=s.password.get_secret_value() if s.password else None,
            protocol=aiomqtt.ProtocolVersion.V5 if self._v5 else aiomqtt.ProtocolVersion.V311,
            # A persistent session: requests published while we reconnect wait for us.
            clean_session=None if self._v5 else False,
            **v5_session,
            properties=properties,
            keepalive=s.keepalive_s,
            tls_context=tls_context,
            tls_insecure=s.tls_insecure if self._address.tls else None,
            # Replies in flight: those being served and those awaiting their PUBACK, each
            # bounded by the limit (``adapter.MqttAdapter._has_slot``).
            max_inflight_messages=max(20, 2 * s.receive_maximum),
            # Nagle's algorithm holds small QoS 1 packets back 40-90 ms: off.
            socket_options=((socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),),
        )

    async def _subscribe(self, client: aiomqtt.Client) -> None:
        s = self._settings
        plain = self._filter
        want_shared = s.shared_subscription == "on" or (
            s.shared_subscription == "auto" and self._v5
        )
        if want_shared:
            shared = f"$share/{s.share_group}/{plain}"
            granted = await client.subscribe(shared, qos=s.qos)
            codes = [getattr(c, "value", c) for c in granted]
            if all(c in (0, 1, 2) for c in codes):
                self.subscribed_topic = shared
                return
            if s.shared_subscription == "on" or _SHARED_NOT_SUPPORTED not in codes:
                raise aiomqtt.MqttError(f"subscription to {shared} refused: {codes}")
            log.info("MQTT: broker has no shared subscriptions; subscribing plainly")
        granted = await client.subscribe(plain, qos=s.qos)
        codes = [getattr(c, "value", c) for c in granted]
        if not all(c in (0, 1, 2) for c in codes):
            raise aiomqtt.MqttError(f"subscription to {plain} refused: {codes}")
        self.subscribed_topic = plain


async def _until_disconnected(client: aiomqtt.Client) -> None:
    async for _ in client.messages:
        pass
    raise aiomqtt.MqttError("message stream ended")
