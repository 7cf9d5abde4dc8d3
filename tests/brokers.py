"""A real Mosquitto broker for tests: started on a free loopback port with Nagle disabled,
stopped afterwards. Tests that need one fail (never skip) when it is not installed: the test
command installs it."""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

_CANDIDATES = ("mosquitto", "/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto")


@dataclass(frozen=True)
class Broker:
    host: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def url(self) -> str:
        return f"mqtt://{self.host}:{self.port}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def mosquitto_binary() -> str:
    for candidate in _CANDIDATES:
        found = shutil.which(candidate)
        if found:
            return found
    pytest.fail(
        "mosquitto is not installed; these tests need a real broker (the test command "
        "installs it: apt-get install mosquitto)",
        pytrace=False,
    )


@contextlib.contextmanager
def mosquitto(
    folder: Path, *, extra: str = "", anonymous: bool = True, port: int | None = None
) -> Iterator[Broker]:
    """``anonymous=False`` with ``password_file``/``acl_file`` lines in ``extra`` for a broker
    that authenticates its clients; ``port`` when a client already waits on a known one."""
    port = port or free_port()
    config = folder / "mosquitto.conf"
    config.write_text(
        f"listener {port} 127.0.0.1\n"
        f"allow_anonymous {'true' if anonymous else 'false'}\n"
        # Without it a QoS 1 request/reply stalls 40-90 ms on Nagle's algorithm.
        "set_tcp_nodelay true\n"
        # A gateway that is down or busy must not see its queued requests dropped by the
        # broker's default per-client limit of 1000.
        "max_queued_messages 100000\n"
        "persistence false\n" + extra
    )
    log = folder / "mosquitto.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [mosquitto_binary(), "-c", str(config)], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 10
        while True:
            if proc.poll() is not None:
                pytest.fail(f"mosquitto exited with {proc.returncode}:\n{log.read_text()}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"mosquitto did not listen within 10 s:\n{log.read_text()}")
                time.sleep(0.05)
        yield Broker("127.0.0.1", port, proc, log)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
