"""Every busy port told at once, before anything starts: the HTTP port and the embedded
broker's were found one per try (the broker's refused, then on the next start the HTTP one).
Only a port in use is reported here; any other bind error is left to the step that binds, which
names it as before. A port freed or taken between this check and that bind is still reported
there."""

from __future__ import annotations

import errno
import socket

from gateway.lifecycle import StartupError
from gateway.settings.schema import GatewaySettings


def check_ports(settings: GatewaySettings) -> None:
    """Raise one ``StartupError`` naming every configured port that something else holds."""
    wanted: list[tuple[str, str, int, str]] = []
    if settings.http.port:
        wanted.append(("HTTP port", settings.http.host, settings.http.port, "--http-port"))
    if settings.grpc.enabled and settings.grpc.port:
        # grpc binds with SO_REUSEPORT: a second gateway on the port would share it unnoticed.
        wanted.append(("gRPC port", settings.http.host, settings.grpc.port, "--grpc-port"))
    mqtt = settings.mqtt
    if mqtt.enabled and mqtt.broker is None and mqtt.embedded_port:
        wanted.append(("embedded MQTT broker port", "127.0.0.1", mqtt.embedded_port, "--mqtt-port"))
    busy = [(what, port, flag) for what, host, port, flag in wanted if in_use(host, port)]
    if not busy:
        return
    if len(busy) == 1:
        what, port, flag = busy[0]
        raise StartupError(f"{what} {port} is in use (set {flag}{_ALTERNATIVE.get(flag, '')})")
    ports = _listed([f"{what} {port}" for what, port, _ in busy])
    flags = _listed([flag for _, _, flag in busy])
    mqtt_busy = any(flag == "--mqtt-port" for _, _, flag in busy)
    tail = "; --broker for an external broker instead of the embedded one" * mqtt_busy
    raise StartupError(f"{ports} are in use (set {flags}{tail})")


_ALTERNATIVE = {
    "--mqtt-port": ", or --broker for an external broker",
    "--grpc-port": ", or --no-grpc",
}


def _listed(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def in_use(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind
        try:
            s.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False
