"""The event loop ``iotgw serve`` runs on (``serving.event_loop``).

uvloop (libuv under the asyncio API) spends less CPU than the standard loop on what the gateway
does most: socket reads and writes, callbacks, timers. ``auto`` takes it where it is installed
(it is a base dependency except on Windows, where it does not exist) and the standard loop
elsewhere; ``uvloop`` insists on it; ``asyncio`` is the standard loop, exactly as
``asyncio.run`` makes it.

Everything the gateway does on its loop works on both: aiohttp's server, paho-mqtt's sockets
(aiomqtt's reader and writer callbacks), ``run_in_executor``, ``call_soon_threadsafe``, signal
handlers, and the embedded mosquitto child (``asyncio.create_subprocess_exec`` through
``setpriv``, see ``gateway.children``).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

EventLoopChoice = Literal["auto", "uvloop", "asyncio"]
LoopFactory = Callable[[], asyncio.AbstractEventLoop]
_T = TypeVar("_T")

log = logging.getLogger("gateway.event_loop")


class EventLoopUnavailable(RuntimeError):
    """The loop asked for cannot be had here."""


def loop_factory(choice: EventLoopChoice) -> tuple[str, LoopFactory | None]:
    """(the loop's name, its factory); None: the standard loop, as ``asyncio.run`` makes it."""
    if choice == "asyncio":
        return "asyncio", None
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        if choice == "uvloop":
            raise EventLoopUnavailable(
                "serving.event_loop is uvloop but uvloop is not installed (pip install uvloop; "
                "there is none for Windows), or set it to auto"
            ) from None
        return "asyncio", None
    factory: LoopFactory = uvloop.new_event_loop
    return f"uvloop {uvloop.__version__}", factory


def run(main: Coroutine[Any, Any, _T], choice: EventLoopChoice) -> _T:
    """``asyncio.run(main)`` on the loop ``choice`` names."""
    try:
        name, factory = loop_factory(choice)
    except EventLoopUnavailable:
        main.close()  # never awaited: say so to no one
        raise
    log.debug("event loop: %s", name)
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
