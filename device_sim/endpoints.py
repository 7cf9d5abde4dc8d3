"""Where the simulator connects: a broker URL or a gateway's HTTP base URL.

A load generator pointed at the wrong host is a denial of service, so by default only loopback
addresses are accepted; ``allow_remote`` is the explicit opt-out for testing a real deployment.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

_MQTT_PORTS = {"mqtt": 1883, "mqtts": 8883}


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    host: str
    port: int
    tls: bool = False
    username: str | None = None
    password: str | None = None

    @classmethod
    def parse(cls, url: str) -> BrokerAddress:
        """``mqtt://[user[:password]@]host[:port]`` or ``mqtts://...`` (TLS)."""
        parts = urlsplit(url)
        if parts.scheme not in _MQTT_PORTS or not parts.hostname:
            raise ValueError(f"broker URL must look like mqtt://host:port, got {url!r}")
        return cls(
            host=parts.hostname,
            port=parts.port or _MQTT_PORTS[parts.scheme],
            tls=parts.scheme == "mqtts",
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password else None,
        )

    def __str__(self) -> str:
        return f"{'mqtts' if self.tls else 'mqtt'}://{self.host}:{self.port}"


def http_host(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"HTTP URL must look like http://host:port, got {url!r}")
    return parts.hostname


async def require_loopback(host: str) -> None:
    """Raise unless every address ``host`` resolves to is a loopback address."""
    try:
        # The loop's resolver: a DNS lookup must not stall other tasks on the loop.
        infos = await asyncio.get_running_loop().getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        raise ValueError(f"cannot resolve {host!r}: {exc}") from None
    addresses = {str(info[4][0]) for info in infos}
    remote = sorted(a for a in addresses if not ipaddress.ip_address(a.split("%")[0]).is_loopback)
    if remote:
        raise ValueError(
            f"{host!r} resolves to non-loopback {remote}; the simulator only loads loopback "
            "endpoints unless --allow-remote is given"
        )
