"""Starts the ingest processes, restarts one that exits (with backoff, so a process that cannot
start does not spin), and stops them: SIGTERM first, so each answers what it took, then SIGKILL
after the grace period. Each dies with the serving process even when that one is SIGKILLed
(``gateway.children``), so none is left holding the port."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import time
from collections.abc import Callable

from gateway.children import dying_with_parent

log = logging.getLogger("gateway.ingest")

_BACKOFF_FIRST_S = 0.5
_BACKOFF_MAX_S = 30.0
# A process that ran this long is taken as healthy: its next exit restarts without delay growth.
_HEALTHY_AFTER_S = 60.0


class IngestSupervisor:
    def __init__(
        self,
        count: int,
        socket_path: str,
        *,
        log_level: str,
        log_format: str,
        event_loop: str = "auto",
        json_codec: str = "orjson",
        on_restart: Callable[[], None] = lambda: None,
    ) -> None:
        self.count = count
        self._on_restart = on_restart
        self._argv = [sys.executable, "-m", "gateway.ingest.worker", "--socket", socket_path]
        self._argv += ["--log-level", log_level, "--log-format", log_format]
        self._argv += ["--event-loop", event_loop, "--json-codec", json_codec]
        self._procs: dict[int, asyncio.subprocess.Process] = {}
        self._keepers: list[asyncio.Task[None]] = []
        self._stopping = False
        self.restarts = 0

    def start(self) -> None:
        self._keepers = [
            asyncio.create_task(self._keep(i), name=f"ingest-{i}") for i in range(self.count)
        ]

    def pids(self) -> dict[int, int]:
        return {i: p.pid for i, p in self._procs.items() if p.returncode is None}

    async def _keep(self, index: int) -> None:
        backoff = _BACKOFF_FIRST_S
        while not self._stopping:
            started = time.monotonic()
            argv, preexec = dying_with_parent([*self._argv, "--index", str(index)])
            proc = await asyncio.create_subprocess_exec(*argv, preexec_fn=preexec)
            self._procs[index] = proc
            code = await proc.wait()
            if self._stopping:
                return
            if time.monotonic() - started > _HEALTHY_AFTER_S:
                backoff = _BACKOFF_FIRST_S
            log.warning(
                "ingest process %d exited with %s; restarting in %.1f s", index, code, backoff
            )
            self.restarts += 1
            self._on_restart()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _BACKOFF_MAX_S)

    async def stop(self, grace_s: float) -> bool:
        """SIGTERM to all, wait up to ``grace_s`` (each drains), then SIGKILL. True when every
        process exited with 0 in time."""
        self._stopping = True
        live = [p for p in self._procs.values() if p.returncode is None]
        for proc in live:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        clean = True
        if live:
            waits = [asyncio.ensure_future(p.wait()) for p in live]
            _, pending = await asyncio.wait(waits, timeout=max(grace_s, 0.0) + 1.0)
            for proc in live:
                if proc.returncode is None:
                    clean = False
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
            if pending:
                await asyncio.wait(pending, timeout=5.0)
            clean = clean and all(p.returncode == 0 for p in live)
        for keeper in self._keepers:
            keeper.cancel()
        for keeper in self._keepers:
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
        return clean
