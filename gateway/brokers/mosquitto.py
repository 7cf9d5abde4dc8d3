"""Mosquitto as the embedded broker: a child process the gateway configures, starts, waits for
and stops. It speaks MQTT 5 (shared subscriptions, Response Topic), listens on 127.0.0.1 only
and persists queued requests in a folder of its own, ``<cache_dir>/mosquitto/<port>/``
(``broker_dir``): one per listener port, so two gateways on one machine, which cannot share a
port, never share a configuration or a store, and a gateway restarted on its port finds the
requests queued for its persistent session. The folder is locked while its broker runs, before
anything is written there: a second gateway pointed at it (the same port, started at the same
moment) is refused without touching the first one's files. A broker on a port picked at random
(``--mqtt-port 0``) has nothing to find again: its folder goes when it stops."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import pwd
import shutil
import time
from pathlib import Path

from gateway.children import dying_with_parent
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


def broker_dir(cache_dir: Path, port: int) -> Path:
    """The folder of the embedded broker listening on ``port``."""
    return cache_dir / "mosquitto" / str(port)


def find_mosquitto() -> str | None:
    for candidate in CANDIDATES:
        found = shutil.which(candidate)
        if found:
            return found
    return None


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
        ephemeral: bool = False,
    ) -> None:
        self.binary = binary
        self.host = host
        self.port = port
        self.data_dir = data_dir
        self.password_file = password_file
        self.max_inflight = max_inflight
        self.ephemeral = ephemeral  # the folder is removed at stop
        self._process: asyncio.subprocess.Process | None = None
        self._lock: int | None = None  # the folder's lock file, held while the broker runs

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
        self._take_folder()
        try:
            _adopt_legacy_store(self.data_dir, self.port)
            config = self.data_dir / "mosquitto.conf"
            config.write_text(self.config(), encoding="utf-8")
            await self._start_process(config)
        except BaseException:
            self._release_folder()
            raise
        log.info(
            "embedded MQTT broker (mosquitto, MQTT 5, pid %d) listening on %s; data in %s",
            self.pid,
            self.url,
            self.data_dir,
        )

    def _take_folder(self) -> None:
        """Lock the folder for this broker (released at stop, or by the kernel with the
        process), or refuse: another gateway's broker runs from it."""
        path = self.data_dir / "lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise StartupError(
                f"the embedded broker's folder {self.data_dir} is in use by another gateway "
                f"(pid {holder}); set another --mqtt-port or --cache-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock = fd

    def _release_folder(self) -> None:
        fd, self._lock = self._lock, None
        if fd is None:
            return
        if self.ephemeral:
            shutil.rmtree(self.data_dir, ignore_errors=True)
        os.close(fd)  # after the removal: no other broker may take the folder meanwhile

    async def _start_process(self, config: Path) -> None:
        with self.log_file.open("wb") as out:
            argv, preexec = dying_with_parent([self.binary, "-c", str(config)])
            self._process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                preexec_fn=preexec,
            )
        try:
            await self._wait_listening()
        except BaseException:
            await self._stop_process()
            raise

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
        try:
            await self._stop_process()
        finally:
            self._release_folder()

    async def _stop_process(self) -> None:
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


def _adopt_legacy_store(folder: Path, port: int) -> None:
    """Earlier versions kept one store for every port in ``<cache_dir>/mosquitto/`` itself:
    the store of the broker that last listened on ``port`` moves into its own folder, so the
    requests queued for the gateway's persistent session survive the upgrade."""
    legacy = folder.parent
    store, config = legacy / "mosquitto.db", legacy / "mosquitto.conf"
    if (folder / "mosquitto.db").exists() or not store.is_file() or not config.is_file():
        return
    with contextlib.suppress(OSError):
        listeners = [line.split() for line in config.read_text().splitlines()]
        if any(words[:2] == ["listener", str(port)] for words in listeners):
            store.rename(folder / "mosquitto.db")
            config.unlink()
