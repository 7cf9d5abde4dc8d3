"""The gateway's life as the outside world sees it: whether it is ready (every configured ingest
live), why a start failed, and which HTTP requests a shutdown must wait for."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator

from aiohttp import web

from gateway.model_host import ModelState
from gateway.model_registry import ModelRegistry

# A check answers None when its part is live, else what it waits for ("mqtt: not subscribed"),
# or a list of such lines when several things are missing (one per model version).
Check = Callable[[], str | list[str] | None]


class StartupError(Exception):
    """A start that cannot succeed as configured; the message names what is wrong and the
    option that fixes it, and is all ``iotgw serve`` prints (a traceback only at DEBUG)."""


class Readiness:
    """What ``/v2/health/ready`` answers. Each component that takes requests registers a check
    as it starts; the gateway is ready when none of them waits for anything and it is not
    shutting down (a load balancer stops sending before the gateway stops taking)."""

    def __init__(self) -> None:
        self._checks: list[Check] = []
        self._shutting_down = False
        self._on_ready: list[Callable[[], None]] = []

    def when_ready(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once, the first time the gateway is found ready, by whoever asks
        first (``/v2/health/ready`` or a poll): so the ready line is in the log before any
        client has read a 200."""
        self._on_ready.append(callback)

    def require(self, check: Check) -> None:
        self._checks.append(check)

    def shutting_down(self) -> None:
        self._shutting_down = True

    def waiting_for(self) -> list[str]:
        waiting: list[str] = []
        for check in self._checks:
            reason = check()
            if isinstance(reason, str):
                waiting.append(reason)
            elif reason:
                waiting.extend(reason)
        if self._shutting_down:
            waiting.insert(0, "gateway: shutting down")
        if not waiting and self._on_ready:
            callbacks, self._on_ready = self._on_ready, []
            for callback in callbacks:
                callback()
        return waiting

    @property
    def ready(self) -> bool:
        return not self.waiting_for()


def models_check(registry: ModelRegistry) -> Check:
    """Ready when every required model version (config key ``required``, default true) is
    loaded and at least one version serves. A version that is not required (say, one whose
    backend is not installed here) or that an operator unloaded holds nothing back. Each
    required version that is missing gets a line naming it, its state and why."""

    def check() -> list[str] | None:
        statuses = registry.statuses()
        missing = [s for s in statuses if s.required and s.state != ModelState.READY.value]
        waiting = ["models: loading"] if any(s.state == "LOADING" for s in missing) else []
        waiting += [
            f"model {s.name} version {s.version}: {s.state.lower()}"
            + (f": {s.reason}" if s.reason else "")
            for s in missing
            if s.state != ModelState.LOADING.value
        ]
        if not waiting and not any(s.state == ModelState.READY.value for s in statuses):
            waiting.append(
                "models: none could be loaded" if statuses else "models: the repository is empty"
            )
        return waiting or None

    return check


class InFlight:
    """Counts requests taken and not yet answered (HTTP requests inside their handler, gRPC
    calls and a stream's requests one by one), so a shutdown can wait until they are done
    while the servers still listen (and readiness and health say not ready)."""

    def __init__(self) -> None:
        self.count = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        """One request inside, for the ``with`` block."""
        self.count += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.count -= 1
            if self.count == 0:
                self._idle.set()

    @web.middleware
    async def middleware(
        self,
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        with self():
            return await handler(request)

    async def wait_idle(self, timeout_s: float) -> bool:
        """True when no request is in flight within ``timeout_s``."""
        try:
            await asyncio.wait_for(self._idle.wait(), max(timeout_s, 0.0))
        except TimeoutError:
            return False
        return True
