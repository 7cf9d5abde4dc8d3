"""A real Mosquitto for the device simulator's tests, started once per session on a free
loopback port (never skipped: without Mosquitto these tests cannot say anything)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

_CANDIDATES = ("mosquitto", "/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto")


@dataclass(frozen=True)
class Mosquitto:
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"mqtt://{self.host}:{self.port}"


def _binary() -> str:
    for candidate in _CANDIDATES:
        found = shutil.which(candidate)
        if found:
            return found
    pytest.fail(
        "mosquitto is not installed (looked for " + ", ".join(_CANDIDATES) + "); the device "
        "simulator's tests need a real broker: apt-get install mosquitto",
        pytrace=False,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_listening(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"mosquitto exited with {proc.returncode}:\n{log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    pytest.fail(f"mosquitto did not listen on port {port} within 10 s:\n{log.read_text()}")


@pytest.fixture(scope="session")
def mosquitto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mosquitto]:
    binary = _binary()
    folder = tmp_path_factory.mktemp("mosquitto")
    port = _free_port()
    config = folder / "mosquitto.conf"
    config.write_text(
        f"listener {port} 127.0.0.1\n"
        "allow_anonymous true\n"
        # Without it a QoS 1 request/reply stalls 40-90 ms on Nagle's algorithm.
        "set_tcp_nodelay true\n"
        # The test responder is one client receiving every device's requests: the default
        # queue of 1000 messages per client would drop some in a burst and fake losses.
        "max_queued_messages 100000\n"
        "persistence false\n"
    )
    log = folder / "mosquitto.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([binary, "-c", str(config)], stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_listening(port, proc, log)
        yield Mosquitto("127.0.0.1", port)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
