"""Trust refusals told to the operator: a request refused for its route (a Response Topic
outside the device's reply namespace, a publisher identity that does not match,
``gateway/mqtt/trust.py``) is answered with a 403 on the device's default reply topic, which an
MQTT 5 requester reading only its Response Topic never sees. Without a log line the device just
times out and nobody can tell why, so the first refusal of each device is logged at INFO, with
the device, what it asked for, the rule and where the 403 went.

Rate-limited per device (a misconfigured fleet would otherwise log every request), with the
refusals held back counted into the next line; the devices remembered are bounded (the least
recently refused are forgotten first, and at worst log again)."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable

from gateway.errors import GatewayError

log = logging.getLogger("gateway.mqtt")

REFUSAL_LOG_INTERVAL_S = 60.0
_DEVICES = 4096


class RefusalLog:
    """One INFO line per device per ``interval_s`` for the requests refused by the trust rules;
    the rest at DEBUG, counted into the device's next INFO line."""

    def __init__(
        self,
        *,
        interval_s: float = REFUSAL_LOG_INTERVAL_S,
        devices: int = _DEVICES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._interval_s = interval_s
        self._devices = devices
        self._clock = clock
        # device -> (when its last INFO line was written, refusals held back since)
        self._last: OrderedDict[str, tuple[float, int]] = OrderedDict()

    def __len__(self) -> int:
        """Devices remembered (at most ``devices``)."""
        return len(self._last)

    def refused(self, device: str, refusal: GatewayError, reply_topic: str) -> None:
        now = self._clock()
        last = self._last.get(device)
        if last is not None and now - last[0] < self._interval_s:
            self._last[device] = (last[0], last[1] + 1)
            self._last.move_to_end(device)
            log.debug("MQTT: refused a request from device %r: %s", device, refusal)
            return
        held = f"; {last[1]} more refused since its last line" if last and last[1] else ""
        log.info(
            "MQTT: refused a request from device %r (%d %s): %s; the error reply went to %s "
            "(its further refusals for %g s are logged at DEBUG%s)",
            device,
            refusal.status,
            refusal.reason,
            refusal,
            reply_topic,
            self._interval_s,
            held,
        )
        self._last[device] = (now, 0)
        self._last.move_to_end(device)
        while len(self._last) > self._devices:
            self._last.popitem(last=False)
