"""What the request flow remembers about requests across deliveries, bounded: which ones were
seen recently, with a digest of their payload and, once answered, their reply (a redelivery
gets the same reply again; another request reusing the id is told so), and how often a
request's reply was lost with its connection (a reply the broker keeps refusing must not loop
forever)."""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from dataclasses import dataclass

Key = tuple[str, bytes]  # (device, reply topic + correlation data or id)
Reply = tuple[bytes, bool, int]  # body, binary framing, status

_ENTRIES = 20_000
# Replies kept for redeliveries, all together: beyond it the oldest are dropped (a redelivery of
# those is acknowledged without a reply, as before replies were kept).
_REPLY_BYTES = 32 * 1024 * 1024
# A request whose reply was published this many times, each time followed by the connection's
# loss before the broker acknowledged it, is answered with an error on the device's own reply
# topic instead: a reply the broker refuses (and drops the gateway for) must not bring the same
# request back after every reconnect, stalling every other device each time.
MAX_REPLY_ATTEMPTS = 3


@dataclass(slots=True)
class Earlier:
    """The first request seen under a key."""

    seen_at: float
    digest: bytes
    reply: Reply | None = None  # None while it is being answered (or its reply was dropped)


def digest(payload: bytes) -> bytes:
    return hashlib.blake2b(payload, digest_size=16).digest()


class SeenRequests:
    def __init__(self, window_s: float) -> None:
        self._window_s = window_s
        self._seen: OrderedDict[Key, Earlier] = OrderedDict()
        self._reply_bytes = 0
        self._lost_replies: OrderedDict[Key, int] = OrderedDict()

    def earlier(self, key: Key | None, payload_digest: bytes) -> Earlier | None:
        """The request seen under ``key`` within the window, or None after recording this one
        as the first (a request without a key cannot be matched: never a repeat)."""
        if key is None:
            return None
        now = time.monotonic()
        while self._seen:
            oldest_key, oldest = next(iter(self._seen.items()))
            if len(self._seen) < _ENTRIES and now - oldest.seen_at < self._window_s:
                break
            self._drop(oldest_key)
        found = self._seen.get(key)
        if found is None:
            self._seen[key] = Earlier(now, payload_digest)
        return found

    def remember_reply(self, key: Key | None, reply: Reply) -> None:
        entry = self._seen.get(key) if key is not None else None
        if entry is None or len(reply[0]) > _REPLY_BYTES // 64:
            return  # a very large reply is not kept: its redelivery is only acknowledged
        entry.reply = reply
        self._reply_bytes += len(reply[0])
        for old_key, old in self._seen.items():  # oldest first
            if self._reply_bytes <= _REPLY_BYTES:
                break
            if old.reply is not None and old_key != key:
                self._reply_bytes -= len(old.reply[0])
                old.reply = None

    def forget(self, key: Key | None) -> None:
        """The request went unanswered: its redelivery must be answered, not taken for a
        repeat."""
        if key is not None:
            self._drop(key)

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

    def _drop(self, key: Key) -> None:
        entry = self._seen.pop(key, None)
        if entry is not None and entry.reply is not None:
            self._reply_bytes -= len(entry.reply[0])
