"""SimiGrad: the batch size follows the similarity of two half-batch gradients.

The workers are split into halves A and B. Each half's mean gradient (``g_A``, ``g_B``, over
B/2 samples each) is flattened over every parameter, and their cosine ``c`` is the signal: a
low ``c`` means the gradient is mostly noise at this batch size. Every step (after smoothing
``c`` over the last ``window`` values):

- ``c < target``: grow, ``b <- max(b + 1, floor(1.1 b))``;
- ``c > target`` and ``b > 1``: shrink, ``b <- max(1, min(b - 1, floor(0.9 b)))``;
- then clamp to ``[min_micro_batch, max_micro_batch]``.

The rule runs on the per-worker micro-batch ``b`` (global batch ``B = W b``), so every worker
always gets the same number of samples, as in data-parallel training. The learning rate is
scaled by ``sqrt(B / B0)`` (``B0``: the starting global batch), applied at the optimizer step.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class SimiGradConfig:
    target: float = 0.5
    """Cosine similarity the batch size is steered toward."""
    min_micro_batch: int = 2
    """Smallest per-worker batch."""
    max_micro_batch: int = 64
    """Largest per-worker batch."""
    window: int = 1
    """Mean of the last ``window`` similarities drives the rule (1: no smoothing)."""
    scale_lr: bool = True
    """Scale the learning rate by sqrt(B / B0)."""

    def __post_init__(self) -> None:
        if not -1.0 <= self.target <= 1.0:
            raise ValueError(f"target similarity must be in [-1, 1], got {self.target}")
        if not 1 <= self.min_micro_batch <= self.max_micro_batch:
            raise ValueError("need 1 <= min_micro_batch <= max_micro_batch")
        if self.window < 1:
            raise ValueError("window must be at least 1")


def cosine_similarity(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine of two flattened gradients, accumulated in float64 (0 when either is zero)."""
    a64 = a.astype(np.float64).ravel()
    b64 = b.astype(np.float64).ravel()
    norm = float(np.linalg.norm(a64) * np.linalg.norm(b64))
    return float(a64 @ b64) / norm if norm > 0.0 else 0.0


def half_similarity(worker_grads: Iterable[np.ndarray]) -> float:
    """SimiGrad's signal from per-worker gradients, each ``[world, ...]`` (one per tensor):
    the cosine of the first half's mean gradient and the second half's."""
    firsts, seconds = [], []
    for g in worker_grads:
        half = g.shape[0] // 2
        if half == 0 or g.shape[0] % 2:
            raise ValueError(f"SimiGrad needs an even number of workers, got {g.shape[0]}")
        flat = g.reshape(g.shape[0], -1).astype(np.float64)
        firsts.append(flat[:half].mean(axis=0))
        seconds.append(flat[half:].mean(axis=0))
    return cosine_similarity(np.concatenate(firsts), np.concatenate(seconds))


def next_micro_batch(micro_batch: int, similarity: float, config: SimiGradConfig) -> int:
    """One application of the +/-10% rule."""
    b = micro_batch
    if similarity < config.target:
        b = max(b + 1, math.floor(1.1 * b))
    elif similarity > config.target and b > 1:
        b = max(1, min(b - 1, math.floor(0.9 * b)))
    return min(max(b, config.min_micro_batch), config.max_micro_batch)


def scaled_lr(base_lr: float, batch: int, base_batch: int) -> float:
    """``base_lr * sqrt(batch / base_batch)``."""
    return base_lr * math.sqrt(batch / base_batch)


class SimiGradController:
    """Holds the micro-batch and the recent similarities; ``observe`` applies the rule."""

    def __init__(self, config: SimiGradConfig, micro_batch: int) -> None:
        self.config = config
        self.micro_batch = micro_batch
        self.recent: deque[float] = deque(maxlen=config.window)

    def observe(self, similarity: float) -> int:
        self.recent.append(similarity)
        signal = float(np.mean(self.recent))
        self.micro_batch = next_micro_batch(self.micro_batch, signal, self.config)
        return self.micro_batch
