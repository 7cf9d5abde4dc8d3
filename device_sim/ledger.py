"""Per-request measurements, kept in preallocated arrays (one slot per planned request) so a run
of a million requests costs tens of megabytes and the summary is a few numpy reductions.

All times are seconds from the run's start, from ``time.perf_counter`` taken at the device: the
send time just before the publish/POST, the reply time when the device's reader takes the reply.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np


class Outcome(IntEnum):
    PENDING = 0
    OK = 1  # a reply with status 200
    ERROR = 2  # a reply with another status, or the transport failed
    LOST = 3  # no reply within the timeout
    NOT_SENT = 4  # the simulator's own in-flight bound refused it


@dataclass(frozen=True, slots=True)
class Result:
    """What a device reports for one request (perf_counter stamps)."""

    outcome: Outcome
    sent: float
    received: float | None = None  # None when lost
    status: int = 0
    kind: str | None = None  # error kind for ERROR


@dataclass(slots=True)
class Counters:
    """Running totals for the live progress line."""

    sent: int = 0
    ok: int = 0
    errors: int = 0
    lost: int = 0
    not_sent: int = 0

    @property
    def in_flight(self) -> int:
        return self.sent - self.ok - self.errors - self.lost


class Ledger:
    def __init__(self, planned: int, origin: float) -> None:
        self.origin = origin  # perf_counter at the run's start
        self.sent_at = np.full(planned, np.nan)
        self.done_at = np.full(planned, np.nan)  # reply time, or when the request was given up
        self.outcome = np.zeros(planned, dtype=np.int8)
        self.status = np.zeros(planned, dtype=np.int16)
        self.kind = np.full(planned, -1, dtype=np.int16)  # index into kinds
        self.kinds: list[str] = []
        self.kind_status: dict[str, int] = {}
        self.counters = Counters()
        self.late_replies = 0  # replies to requests already counted lost
        self.duplicate_replies = 0  # second replies to answered requests
        self.unmatched_replies = 0  # replies that name no request of this run
        self._recent: list[float] = []  # latencies since the last progress line

    def _kind_index(self, kind: str, status: int) -> int:
        if kind not in self.kind_status:
            self.kind_status[kind] = status
            self.kinds.append(kind)
        return self.kinds.index(kind)

    def sending(self) -> None:
        self.counters.sent += 1

    def record(self, i: int, result: Result) -> None:
        self.sent_at[i] = result.sent - self.origin
        if result.received is not None:
            self.done_at[i] = result.received - self.origin
        self.outcome[i] = result.outcome
        self.status[i] = result.status
        c = self.counters
        if result.outcome is Outcome.OK:
            c.ok += 1
            if result.received is not None:
                self._recent.append(result.received - result.sent)
        elif result.outcome is Outcome.ERROR:
            c.errors += 1
            self.kind[i] = self._kind_index(result.kind or "unknown", result.status)
        elif result.outcome is Outcome.LOST:
            c.lost += 1

    def refuse(self, i: int, kind: str) -> None:
        self.outcome[i] = Outcome.NOT_SENT
        self.kind[i] = self._kind_index(kind, 0)
        self.counters.not_sent += 1

    def unexpected_reply(self, i: int | None) -> None:
        """A reply that matched no waiting request: late, duplicate, or foreign."""
        if i is None or not 0 <= i < self.outcome.size:
            self.unmatched_replies += 1
        elif self.outcome[i] == Outcome.LOST:
            self.late_replies += 1
        elif self.outcome[i] in (Outcome.OK, Outcome.ERROR):
            self.duplicate_replies += 1
        else:
            self.unmatched_replies += 1

    def take_recent(self) -> list[float]:
        recent, self._recent = self._recent, []
        return recent
