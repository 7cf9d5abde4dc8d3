"""Running estimate of how long a batch of a given size takes to compute.

Kept per power-of-two size bucket as an exponentially weighted mean, because compute time grows
with batch size but not linearly (fixed per-call overhead dominates small batches).
"""

from __future__ import annotations

import math


class ServiceTimeEstimate:
    def __init__(self, *, alpha: float = 0.2) -> None:
        self._alpha = alpha
        self._by_bucket: dict[int, float] = {}

    @staticmethod
    def _bucket(rows: int) -> int:
        return max(0, math.ceil(math.log2(max(rows, 1))))

    def observe(self, rows: int, seconds: float) -> None:
        b = self._bucket(rows)
        prev = self._by_bucket.get(b)
        self._by_bucket[b] = seconds if prev is None else prev + self._alpha * (seconds - prev)

    def predict(self, rows: int) -> float | None:
        """Seconds for one batch of ``rows``; None before anything was measured."""
        if not self._by_bucket:
            return None
        b = self._bucket(rows)
        if b in self._by_bucket:
            return self._by_bucket[b]
        nearest = min(self._by_bucket, key=lambda k: abs(k - b))
        # A larger batch than any measured: scale up linearly, which over-estimates (safe for
        # admission); a smaller one: take the smallest measured, also an over-estimate.
        scale = 2.0 ** (b - nearest) if b > nearest else 1.0
        return self._by_bucket[nearest] * scale
