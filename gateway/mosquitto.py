"""Mosquitto as the embedded broker: a child process the gateway configures, starts, waits for
and stops. It speaks MQTT 5 (shared subscriptions, Response Topic), persists queued requests
under ``<cache_dir>/mosquitto/`` and listens on 127.0.0.1 only."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import os
import pwd
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from gateway.lifecycle import StartupError

log = logging.getLogger("gateway.broker")

CANDIDATES = ("mosquitto", "/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto")
# Requests queued for a gateway that is down or busy, per client. Under overload the gateway
# answers with 503s as fast as it can read, and this queue absorbs what arrives faster than
# that: 10,000 messages overflowed within seconds at 3x capacity (requests dropped unanswered).
# The byte bound is the real limit, so a long outage cannot exhaust the machine's memory
# (beyond it the broker drops, and says so in its log).
MAX_QUEUED_MESSAGES = 1_000_000
MAX_QUEUED_BYTES = 256 * 1024 * 1024
_START_TIMEOUT_S = 10.0
_STOP_TIMEOUT_S = 5.0
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def find_mosquitto() -> str | None:
    for candidate in CANDIDATES:
        found = shutil.which(candidate)
        if found:
            return found
    return None


def die_with_parent() -> None:
    """Runs in the child between fork and exec. Without it a SIGKILLed gateway would leave its
    broker running and holding the port, so the next start fails. The kernel sends the signal
    when the *thread* that forked exits; the event loop's thread forks here, and it lives as
    long as the gateway. Only the prctl call runs here: after a fork in a threaded process the
    child may take no lock another thread held."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _load_prctl() -> Callable[..., int] | None:
    # Looked up in the parent: the child must not load libraries between fork and exec.
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    libc = ctypes.CDLL(name, use_errno=True)
    return getattr(libc, "prctl", None)


_prctl = _load_prctl() if sys.platform.startswith("linux") else None


class MosquittoBroker:
    """``await start()`` returns once the broker accepts connections, or raises
    ``StartupError`` with the reason from its log; ``stop()`` sends SIGTERM (it then saves its
    store), and kills it if it has not exited within 5 s."""

    protocol = "5"
    name = "mosquitto"

    def __init__(
        self,
        *,
        binary: str,
        port: int,
        data_dir: Path,
        password_file: Path | None = None,
        max_inflight: int = 64,
        host: str = "127.0.0.1",
    ) -> None:
        self.binary = binary
        self.host = host
        self.port = port
        self.data_dir = data_dir
        self.password_file = password_file
        self.max_inflight = max_inflight
        self._process: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"mqtt://{self.host}:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "mosquitto.log"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def config(self) -> str:
        auth = (
            f"allow_anonymous false\npassword_file {self.password_file}\n"
            if self.password_file is not None
            else "allow_anonymous true\n"
        )
        return (
            "# Written by iotgw serve at every start; edits are lost.\n"
            f"listener {self.port} {self.host}\n"
            f"{auth}"
            # Without it a QoS 1 request/reply stalls 40-90 ms on Nagle's algorithm.
            "set_tcp_nodelay true\n"
            # Requests queued for the gateway's persistent session survive a broker restart.
            "persistence true\n"
            f"persistence_location {self.data_dir}/\n"
            f"max_queued_messages {MAX_QUEUED_MESSAGES}\n"
            f"max_queued_bytes {MAX_QUEUED_BYTES}\n"
            f"max_inflight_messages {self.max_inflight}\n"
            # Run as root, mosquitto would switch to the 'mosquitto' user, which cannot write
            # a store under this user's cache directory: it stays who started it.
            f"user {pwd.getpwuid(os.getuid()).pw_name}\n"
            "log_dest stdout\n"
            "log_type error\nlog_type warning\nlog_type notice\n"
        )

    async def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        config = self.data_dir / "mosquitto.conf"
        config.write_text(self.config(), encoding="utf-8")
        with self.log_file.open("wb") as out:
            self._process = await asyncio.create_subprocess_exec(
                self.binary,
                "-c",
                str(config),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                preexec_fn=die_with_parent,
            )
        try:
            await self._wait_listening()
        except BaseException:
            await self.stop()
            raise
        log.info(
            "embedded MQTT broker (mosquitto, MQTT 5, pid %d) listening on %s; data in %s",
            self._process.pid,
            self.url,
            self.data_dir,
        )

    async def _wait_listening(self) -> None:
        process = self._process
        assert process is not None
        exited = asyncio.ensure_future(process.wait())
        try:
            deadline = time.monotonic() + _START_TIMEOUT_S
            while not await self._accepts_connections():
                # Short polls: it binds within milliseconds of starting, or exits.
                await asyncio.wait({exited}, timeout=0.05)
                if exited.done():
                    raise StartupError(
                        f"embedded mosquitto exited with code {process.returncode}: "
                        f"{self._last_log_line()} (log: {self.log_file})"
                    )
                if time.monotonic() > deadline:
                    raise StartupError(
                        f"embedded mosquitto did not listen on {self.url} within "
                        f"{_START_TIMEOUT_S:.0f} s (log: {self.log_file})"
                    )
        finally:
            exited.cancel()

    async def _accepts_connections(self) -> bool:
        try:
            _, writer = await asyncio.open_connection(self.host, self.port)
        except OSError:
            return False
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True

    def _last_log_line(self) -> str:
        try:
            lines = self.log_file.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "no log"
        errors = [line for line in lines if "rror" in line] or lines
        return errors[-1].strip() if errors else "no log output"

    async def stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.returncode is not None:
            return
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), _STOP_TIMEOUT_S)
        except TimeoutError:
            log.warning("embedded mosquitto did not stop within %.0f s: killed", _STOP_TIMEOUT_S)
            process.kill()
            await process.wait()
