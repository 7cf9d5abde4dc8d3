"""The embedded MQTT broker (amqtt, MQTT 3.1.1) that makes ``iotgw serve`` work with nothing
else installed. Bound to 127.0.0.1 only: it has no authentication, so it must not be reachable
from the network. Production uses an external MQTT 5 broker (``--broker``)."""

from __future__ import annotations

import logging
import socket

log = logging.getLogger("gateway.broker")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class EmbeddedBroker:
    def __init__(self, *, port: int, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = port if port else free_port(host)
        self._broker: object | None = None

    @property
    def url(self) -> str:
        return f"mqtt://{self.host}:{self.port}"

    async def start(self) -> None:
        from amqtt.broker import Broker  # imported here: only the embedded mode needs it

        config = {
            "listeners": {"default": {"type": "tcp", "bind": f"{self.host}:{self.port}"}},
            "plugins": {
                "amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True},
            },
        }
        broker = Broker(config)
        await broker.start()
        self._broker = broker
        log.info("embedded MQTT broker (amqtt, MQTT 3.1.1) listening on %s", self.url)

    async def stop(self) -> None:
        if self._broker is not None:
            await self._broker.shutdown()  # type: ignore[attr-defined]
            self._broker = None
