"""What the request flow remembers about requests across deliveries, bounded: which ones were
seen recently (a redelivery is answered once) and how often a request's reply was lost with
its connection (a reply the broker keeps refusing must not loop forever)."""

from __future__ import annotations

import time
from collections import OrderedDict

Key = tuple[str, bytes]  # (device, reply topic + correlation data or id)

_ENTRIES = 20_000
# A request whose reply was published this many times, each time followed by the connection's
# loss before the broker acknowledged it, is answered with an error on the device's own reply
# topic instead: a reply the broker refuses (and drops the gateway for) must not bring the same
# request back after every reconnect, stalling every other device each time.
MAX_REPLY_ATTEMPTS = 3


class SeenRequests:
    def __init__(self, window_s: float) -> None:
        self._window_s = window_s
        self._seen: OrderedDict[Key, float] = OrderedDict()  # key -> monotonic time first seen
        self._lost_replies: OrderedDict[Key, int] = OrderedDict()

    def is_duplicate(self, key: Key | None, now: float | None = None) -> bool:
        """True when ``key`` was seen within the window; otherwise records it (a request
        without a key cannot be matched, so it is never a duplicate)."""
        if key is None:
            return False
        now = time.monotonic() if now is None else now
        while self._seen:
            oldest_key, seen_at = next(iter(self._seen.items()))
            if len(self._seen) < _ENTRIES and now - seen_at < self._window_s:
                break
            del self._seen[oldest_key]
        if key in self._seen:
            return True
        self._seen[key] = now
        return False

    def forget(self, key: Key | None) -> None:
        """The request went unanswered: its redelivery must be answered, not taken for a
        duplicate."""
        if key is not None:
            self._seen.pop(key, None)

    def reply_lost(self, key: Key | None) -> None:
        if key is None:
            return
        self._lost_replies[key] = self._lost_replies.pop(key, 0) + 1
        while len(self._lost_replies) > _ENTRIES:  # bounded: the oldest are forgotten
            self._lost_replies.popitem(last=False)

    def give_up_on_reply(self, key: Key | None) -> bool:
        """True (once) when the key's replies were lost ``MAX_REPLY_ATTEMPTS`` times."""
        if key is None or self._lost_replies.get(key, 0) < MAX_REPLY_ATTEMPTS:
            return False
        del self._lost_replies[key]
        return True
