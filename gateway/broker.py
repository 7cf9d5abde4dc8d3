"""The embedded MQTT broker that ``iotgw serve`` starts when no ``--broker`` is given: a managed
Mosquitto child (MQTT 5, shared subscriptions; gateway/mosquitto.py) when one is installed,
else amqtt in-process (MQTT 3.1.1) so the gateway works with nothing else installed. Either
binds 127.0.0.1 only, and takes a password file (mosquitto_passwd's format) when one is set.
Production uses an external MQTT 5 broker (``--broker``)."""

from __future__ import annotations

import errno
import logging
import socket
from pathlib import Path
from typing import Any, Protocol

from gateway.lifecycle import StartupError
from gateway.mosquitto import MosquittoBroker, find_mosquitto
from gateway.settings import MqttSettings

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
    check_port_free("127.0.0.1", port)
    choice = settings.embedded_broker
    binary = find_mosquitto() if choice in ("auto", "mosquitto") else None
    if binary is not None:
        return MosquittoBroker(
            binary=binary,
            port=port,
            data_dir=cache_dir / "mosquitto",
            password_file=password_file.resolve() if password_file is not None else None,
            max_inflight=settings.receive_maximum,
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
    """amqtt in this process: the fallback that needs nothing installed."""

    protocol = "3.1.1"
    name = "amqtt"

    def __init__(
        self, *, port: int, host: str = "127.0.0.1", password_file: Path | None = None
    ) -> None:
        self.host = host
        self.port = port if port else free_port(host)
        self.password_file = password_file
        self._broker: Any = None

    @property
    def url(self) -> str:
        return f"mqtt://{self.host}:{self.port}"

    def _plugins(self) -> dict[str, dict[str, Any]]:
        if self.password_file is None:
            return {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}}
        # Without the anonymous plugin a client with no user name gets no verdict: refused.
        return {"gateway.amqtt_auth.PasswordFilePlugin": {"password_file": str(self.password_file)}}

    async def start(self) -> None:
        from amqtt.broker import Broker  # imported here: only this embedded mode needs it

        config = {
            "listeners": {"default": {"type": "tcp", "bind": f"{self.host}:{self.port}"}},
            "plugins": self._plugins(),
        }
        broker = Broker(config)
        try:
            await broker.start()
        except Exception as exc:
            raise StartupError(
                f"embedded amqtt broker failed to start on {self.url}: {exc}"
            ) from exc
        self._broker = broker
        log.info("embedded MQTT broker (amqtt, MQTT 3.1.1) listening on %s", self.url)

    async def stop(self) -> None:
        if self._broker is not None:
            await self._broker.shutdown()
            self._broker = None
