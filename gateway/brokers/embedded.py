"""The embedded MQTT broker that ``iotgw serve`` starts when no ``--broker`` is given: a managed
Mosquitto child (MQTT 5, shared subscriptions; gateway/brokers/mosquitto.py) when one is installed,
else amqtt in-process (MQTT 3.1.1) so the gateway works with nothing else installed. Either
binds 127.0.0.1 only, and takes a password file (mosquitto_passwd's format) when one is set.
Production uses an external MQTT 5 broker (``--broker``)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
from pathlib import Path
from typing import Any, Protocol

from gateway.brokers.mosquitto import MosquittoBroker, broker_dir, find_mosquitto
from gateway.lifecycle import StartupError
from gateway.settings.schema import MqttSettings

log = logging.getLogger("gateway.broker")


class EmbeddedBroker(Protocol):
    host: str
    port: int
    protocol: str  # the MQTT version the gateway speaks to it
    name: str

    @property
    def url(self) -> str: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def check_port_free(host: str, port: int) -> None:
    """Fail before starting a broker on a port something else holds: a connection probe would
    otherwise find that other listener and take it for ours."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as brokers bind
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise StartupError(
                    f"embedded MQTT broker port {port} is in use (set --mqtt-port, or --broker "
                    "for an external broker)"
                ) from None
            raise StartupError(
                f"embedded MQTT broker cannot bind {host}:{port}: {exc.strerror} (set --mqtt-port)"
            ) from None


def embedded_broker(settings: MqttSettings, cache_dir: Path) -> EmbeddedBroker:
    """The broker ``settings.embedded_broker`` names (auto: mosquitto when installed)."""
    password_file = settings.embedded_password_file
    if password_file is not None:
        if not password_file.is_file():
            raise StartupError(
                f"embedded broker password file {password_file} not found "
                "(set --embedded-password-file)"
            )
        if settings.username is None or settings.password is None:
            raise StartupError(
                "the embedded broker has a password file, so the gateway needs its own "
                "credentials (set --mqtt-username and --mqtt-password)"
            )
    port = settings.embedded_port or free_port()
    check_port_free("127.0.0.1", port)  # before any file of that port's broker is touched
    choice = settings.embedded_broker
    binary = find_mosquitto() if choice in ("auto", "mosquitto") else None
    if binary is not None:
        return MosquittoBroker(
            binary=binary,
            port=port,
            data_dir=broker_dir(cache_dir, port),
            password_file=password_file.resolve() if password_file is not None else None,
            max_inflight=settings.receive_maximum,
            ephemeral=not settings.embedded_port,  # a random port: nothing to find again
        )
    if choice == "mosquitto":
        raise StartupError(
            "mosquitto is not installed (looked on PATH and in /usr/sbin; install it, or set "
            "--embedded-broker amqtt)"
        )
    if choice == "auto":
        log.info("mosquitto not found: the embedded broker is amqtt (MQTT 3.1.1)")
    return AmqttBroker(port=port, password_file=password_file)


class AmqttBroker:
    """amqtt in this process: the fallback that needs nothing installed.

    It speaks MQTT 3.1.1 only, and reads an MQTT 5 CONNECT as if it were 3.1.1: the properties
    shift every field, so a client such as ``mosquitto_rr`` got no CONNACK at all and waited for
    its timeout. So this class owns the listening socket (amqtt's ``external`` listener) and reads
    each CONNECT's protocol level first: an MQTT 5 client gets CONNACK 0x84 (Unsupported Protocol
    Version) with a reason string and the connection is closed; anything else goes to amqtt
    with the bytes read so far replayed."""

    protocol = "3.1.1"
    name = "amqtt"

    def __init__(
        self, *, port: int, host: str = "127.0.0.1", password_file: Path | None = None
    ) -> None:
        self.host = host
        self.port = port if port else free_port(host)
        self.password_file = password_file
        self._broker: Any = None
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"mqtt://{self.host}:{self.port}"

    def _plugins(self) -> dict[str, dict[str, Any]]:
        if self.password_file is None:
            return {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}}
        # Without the anonymous plugin a client with no user name gets no verdict: refused.
        return {
            "gateway.brokers.amqtt_auth.PasswordFilePlugin": {
                "password_file": str(self.password_file)
            }
        }

    async def start(self) -> None:
        from amqtt.broker import Broker  # imported here: only this embedded mode needs it

        config = {
            "listeners": {
                _LISTENER: {"type": "external", "bind": f"{self.host}:{self.port}"},
            },
            "plugins": self._plugins(),
        }
        broker = Broker(config)
        try:
            await broker.start()
            self._server = await asyncio.start_server(
                self._connected, self.host, self.port, reuse_address=True
            )
        except Exception as exc:
            await broker.shutdown()
            raise StartupError(
                f"embedded amqtt broker failed to start on {self.url}: {exc}"
            ) from exc
        self._broker = broker
        log.info("embedded MQTT broker (amqtt, MQTT 3.1.1) listening on %s", self.url)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        if self._broker is not None:
            await self._broker.shutdown()
            self._broker = None

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        from amqtt.adapters import StreamWriterAdapter

        sock = writer.get_extra_info("socket")
        if sock is not None:  # replies must not wait on Nagle's algorithm (docs/mqtt.md)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            head, level = await asyncio.wait_for(_connect_head(reader), _CONNECT_WAIT_S)
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, ValueError):
            writer.close()  # no CONNECT worth answering: amqtt would close it too
            return
        if level == MQTT5_LEVEL:
            peer = writer.get_extra_info("peername")
            log.warning(
                "MQTT 5 client from %s refused: the embedded amqtt broker speaks MQTT 3.1.1 only "
                "(connect with MQTT 3.1.1, or install mosquitto for MQTT 5)",
                peer[0] if peer else "?",
            )
            writer.write(MQTT5_REFUSAL)
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            writer.close()
            return
        await self._broker.external_connected(
            _Replay(head, reader), StreamWriterAdapter(writer), _LISTENER
        )


_LISTENER = "default"
_CONNECT_WAIT_S = 10.0  # for the first bytes of a CONNECT; amqtt bounds nothing here
MQTT5_LEVEL = 5
_REASON = b"this broker speaks MQTT 3.1.1 only (embedded amqtt); connect with MQTT 3.1.1"
# CONNACK in its MQTT 5 form: flags 0, reason 0x84 Unsupported Protocol Version, and one
# property, the Reason String (0x1F), which clients may show.
_PROPS = b"\x1f" + len(_REASON).to_bytes(2, "big") + _REASON
MQTT5_REFUSAL = bytes([0x20, 3 + len(_PROPS), 0x00, 0x84, len(_PROPS)]) + _PROPS


async def _connect_head(reader: asyncio.StreamReader) -> tuple[bytes, int]:
    """Read a packet's fixed header and, for a CONNECT, the protocol name and level: (the
    bytes read, the level; 0 for a packet that is not a CONNECT)."""
    head = bytearray(await reader.readexactly(1))
    if head[0] >> 4 != 1:  # not a CONNECT: amqtt answers that itself
        return bytes(head), 0
    for _ in range(4):  # the remaining length: a varint of at most 4 bytes
        byte = await reader.readexactly(1)
        head += byte
        if not byte[0] & 0x80:
            break
    else:
        raise ValueError("malformed remaining length")
    name_length = await reader.readexactly(2)
    name = await reader.readexactly(int.from_bytes(name_length, "big"))
    level = await reader.readexactly(1)
    head += name_length + name + level
    return bytes(head), level[0]


class _Replay:
    """An amqtt reader adapter that first returns the bytes already read from the stream."""

    def __init__(self, head: bytes, reader: asyncio.StreamReader) -> None:
        self._head = head
        self._reader = reader

    async def read(self, n: int = -1) -> bytes:
        if self._head:
            if n == -1:
                data, self._head = self._head + await self._reader.read(), b""
                return data
            data, self._head = self._head[:n], self._head[n:]
            if len(data) < n:
                data += await self._reader.readexactly(n - len(data))
            return data
        if n == -1:
            return await self._reader.read()
        return await self._reader.readexactly(n)

    def feed_eof(self) -> None:
        self._reader.feed_eof()
