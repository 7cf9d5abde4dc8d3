"""SimiGrad's rule on synthetic gradients of known similarity."""

from __future__ import annotations

import math

import numpy as np
import pytest

from models.train.simigrad import (
    SimiGradConfig,
    SimiGradController,
    half_similarity,
    next_micro_batch,
    scaled_lr,
)


def _workers(cosine: float, world: int = 8, size: int = 50) -> list[np.ndarray]:
    """Half A's workers all hold u, half B's all hold v, with cos(u, v) = ``cosine``."""
    u = np.zeros(size)
    u[0] = 1.0
    v = np.zeros(size)
    v[0], v[1] = cosine, math.sqrt(1 - cosine**2)
    grads = np.stack([u] * (world // 2) + [v] * (world // 2)).astype(np.float32)
    return [grads[:, :20].reshape(world, 4, 5), grads[:, 20:]]  # split over two tensors


def test_half_similarity_is_the_cosine_of_the_halves() -> None:
    for c in (-0.5, 0.0, 0.3, 0.9):
        assert half_similarity(_workers(c)) == pytest.approx(c, abs=1e-6)


def test_rule_steps() -> None:
    config = SimiGradConfig(target=0.5, min_micro_batch=1, max_micro_batch=100)
    assert next_micro_batch(10, 0.2, config) == 11  # floor(1.1 * 10)
    assert next_micro_batch(30, 0.2, config) == 33
    assert next_micro_batch(3, 0.2, config) == 4  # at least + 1
    assert next_micro_batch(10, 0.8, config) == 9  # floor(0.9 * 10)
    assert next_micro_batch(30, 0.8, config) == 27
    assert next_micro_batch(5, 0.8, config) == 4  # at least - 1
    assert next_micro_batch(1, 0.8, config) == 1
    assert next_micro_batch(10, 0.5, config) == 10  # on target: unchanged
    bounded = SimiGradConfig(target=0.5, min_micro_batch=4, max_micro_batch=12)
    assert next_micro_batch(12, 0.1, bounded) == 12
    assert next_micro_batch(4, 0.9, bounded) == 4


def test_controller_moves_toward_target_on_synthetic_gradients() -> None:
    config = SimiGradConfig(target=0.5, min_micro_batch=2, max_micro_batch=64)
    low = SimiGradController(config, 8)
    sizes = [low.observe(half_similarity(_workers(0.1))) for _ in range(5)]
    assert sizes == [9, 10, 11, 12, 13]
    high = SimiGradController(config, 8)
    sizes = [high.observe(half_similarity(_workers(0.9))) for _ in range(8)]
    assert sizes == [7, 6, 5, 4, 3, 2, 2, 2]


def test_smoothing_window_averages_similarities() -> None:
    controller = SimiGradController(SimiGradConfig(target=0.5, window=2), 10)
    assert controller.observe(0.9) == 9  # mean 0.9: shrink
    # mean (0.9 + 0.2) / 2 = 0.55 is still above target: shrink again (0.2 alone would grow)
    assert controller.observe(0.2) == 8


def test_learning_rate_scaling() -> None:
    assert scaled_lr(1e-3, 128, 32) == pytest.approx(2e-3)
    assert scaled_lr(1e-3, 32, 32) == 1e-3
