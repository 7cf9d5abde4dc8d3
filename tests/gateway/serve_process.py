"""``iotgw serve`` launched as a process without waiting for it, and what the lifecycle tests
read from outside: readiness, exit status, the embedded mosquitto child, free ports."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.brokers import free_port

DEADLINE_S = 120.0


@dataclass
class Serve:
    process: subprocess.Popen[bytes]
    http_port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def readiness(self) -> tuple[int, dict[str, Any]] | None:
        """(status, body) of /v2/health/ready, or None when nothing answers."""
        try:
            with urllib.request.urlopen(f"{self.url}/v2/health/ready", timeout=5) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())
        except OSError:
            return None

    def wait_readiness(
        self, want: Callable[[int, dict[str, Any]], bool], what: str
    ) -> dict[str, Any]:
        deadline = time.monotonic() + DEADLINE_S
        last: tuple[int, dict[str, Any]] | None = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(
                    f"gateway exited with {self.process.returncode}:\n{self.text()}"
                )
            last = self.readiness()
            if last is not None and want(*last):
                return last[1]
            time.sleep(0.05)
        raise AssertionError(f"readiness never {what} (last: {last}):\n{self.text()}")

    def wait_ready(self) -> None:
        self.wait_readiness(lambda status, _: status == 200, "200")

    def wait_exit(self, timeout_s: float = DEADLINE_S) -> int:
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"gateway did not exit in {timeout_s} s:\n{self.text()}") from None


def serve_command(repo: Path, cache: Path, http_port: int, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gateway.cli",
        "serve",
        "--model-repo",
        str(repo),
        "--cache-dir",
        str(cache),
        "--http-port",
        str(http_port),
        *args,
    ]


@contextlib.contextmanager
def serve(
    repo: Path, folder: Path, *args: str, env: dict[str, str] | None = None
) -> Iterator[Serve]:
    """``iotgw serve`` with its output in ``folder``; SIGKILLed on the way out if still alive."""
    port = free_port()
    log = folder / f"serve-{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            serve_command(repo, folder, port, *args),
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
    try:
        yield Serve(proc, port, log)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()


def mosquitto_children(config: Path) -> list[int]:
    """Pids of the mosquitto processes started with this configuration file."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # exited while we looked
        if str(config).encode() in argv and any(b"mosquitto" in a for a in argv[:1]):
            pids.append(int(entry.name))
    return pids


def wait_gone(config: Path, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while mosquitto_children(config):
        if time.monotonic() > deadline:
            raise AssertionError(f"mosquitto of {config} still running")
        time.sleep(0.05)


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
