"""The digits data set, its fixed split, and the sampler that feeds the simulated workers.

scikit-learn ships the data (1797 images of 8x8 pixels, values 0..16, ten classes), so nothing
is downloaded. Images are scaled to [0, 1] and shaped NHWC ``[N, 8, 8, 1]``: that is what the
served ``digits_cnn`` model takes. The split is stratified with a fixed seed and does not
depend on the training seed: every run, and every accuracy in the report, uses the same test
images.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from models.zoo import Conv2D, Dense, Flatten, Input, MaxPool2D, ModelSpec

SPLIT_SEED = 20240607
VAL_FRACTION = 0.2
TEST_FRACTION = 0.2


@dataclass(frozen=True, slots=True)
class Split:
    """One part of the data set: images ``[N, 8, 8, 1]`` float32 in [0, 1], labels int32."""

    x: np.ndarray
    y: np.ndarray

    def __len__(self) -> int:
        return int(self.y.shape[0])


@dataclass(frozen=True, slots=True)
class Digits:
    train: Split
    val: Split
    test: Split


@cache
def load_digits_split() -> Digits:
    """The fixed stratified train / validation / test split (60 / 20 / 20)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x = (data.images.astype(np.float32) / np.float32(16.0))[..., np.newaxis]
    y = data.target.astype(np.int32)
    x_rest, x_test, y_rest, y_test = train_test_split(
        x, y, test_size=TEST_FRACTION, stratify=y, random_state=SPLIT_SEED
    )
    val_share = VAL_FRACTION / (1.0 - TEST_FRACTION)
    x_train, x_val, y_train, y_val = train_test_split(
        x_rest, y_rest, test_size=val_share, stratify=y_rest, random_state=SPLIT_SEED
    )
    return Digits(Split(x_train, y_train), Split(x_val, y_val), Split(x_test, y_test))


class EpochSampler:
    """Draws batches without replacement from a fresh permutation each epoch.

    A batch that crosses the end of an epoch takes the rest of the permutation and continues
    in the next one, so every sample is seen once per epoch whatever the batch sizes. The
    whole state (generator, permutation, position) can be saved and restored exactly.
    """

    def __init__(self, size: int, seed: int) -> None:
        self._size = size
        self._rng = np.random.default_rng(seed)
        self._order = self._rng.permutation(size)
        self._position = 0

    def next_indices(self, count: int) -> np.ndarray:
        parts = []
        while count > 0:
            if self._position == self._size:
                self._order = self._rng.permutation(self._size)
                self._position = 0
            take = min(count, self._size - self._position)
            parts.append(self._order[self._position : self._position + take])
            self._position += take
            count -= take
        return np.concatenate(parts)

    def state(self) -> dict[str, Any]:
        return {
            "rng": self._rng.bit_generator.state,
            "order": self._order.tolist(),
            "position": self._position,
        }

    def restore(self, state: dict[str, Any]) -> None:
        self._rng.bit_generator.state = state["rng"]
        self._order = np.asarray(state["order"], dtype=np.int64)
        self._position = int(state["position"])


# The CNN trained on digits, bundled in the demo repository as ``digits_cnn``: 38k parameters.
DIGITS_CNN = ModelSpec(
    name="digits_cnn",
    inputs=(Input("image", (8, 8, 1)),),
    layers=(
        Conv2D(16, 3),
        Conv2D(32, 3),
        MaxPool2D(2),
        Flatten(),
        Dense(64, "relu"),
        Dense(10),
    ),
    seed=4,
    description="Handwritten digit classifier (scikit-learn digits: 8x8 grey levels scaled to "
    "[0, 1]) trained ZeRO++-style by iotgw train.",
)
