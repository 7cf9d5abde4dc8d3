"""qwZ in training: the forward pass computes with exactly dequant(quant(W)) of models.quant,
and the straight-through gradient is the float gradient of the dequantized weights."""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from models.quant import quantize_blocks
from models.train.data import DIGITS_CNN
from models.train.network import ZooNetwork, qwz_kernel
from models.train.qwz import QwZConfig, quantize_zoo_kernel, zoo_layout
from models.zoo import Conv2D, Dense, init_weights


def _kernels() -> list[tuple[Dense | Conv2D, np.ndarray]]:
    rng = np.random.default_rng(7)
    return [
        (Dense(24), rng.normal(0, 0.3, (40, 24)).astype(np.float32)),
        (Conv2D(8, 3), rng.normal(0, 0.3, (3, 3, 5, 8)).astype(np.float32)),
    ]


def test_forward_kernel_is_dequantized_codes_of_the_checkpoint_layout() -> None:
    for bits in (8, 6, 4, 3, 2):
        config = QwZConfig(bits, 16)
        for layer, kernel in _kernels():
            recorded: list[Any] = []
            got = qwz_kernel(tf.constant(kernel), layer, config, recorded.append).numpy()
            # The checkpoint layout, written out by hand: output-major rows, blocks along input.
            if isinstance(layer, Dense):
                rows = kernel.T
                back = lambda w: w.T  # noqa: E731
            else:
                rows = kernel.transpose(3, 2, 0, 1).reshape(kernel.shape[3], -1)
                back = lambda w: w.reshape(8, 5, 3, 3).transpose(2, 3, 1, 0)  # noqa: E731
            expected = quantize_blocks(rows, bits, 16)
            np.testing.assert_array_equal(got, back(expected.dequantize()))
            (codes,) = recorded
            np.testing.assert_array_equal(codes.data.codes, expected.codes)
            np.testing.assert_array_equal(codes.data.scales, expected.scales)
            assert np.any(got != kernel)  # it really is quantized


def test_straight_through_gradient_equals_float_gradient_of_dequantized_weights() -> None:
    weights = init_weights(DIGITS_CNN)
    config = QwZConfig(4, 32)
    net = ZooNetwork(DIGITS_CNN, weights)
    rng = np.random.default_rng(3)
    x = tf.constant(rng.random((6, 8, 8, 1), dtype=np.float32))
    y = tf.constant(rng.integers(0, 10, 6).astype(np.int32))

    def loss_of(logits: tf.Tensor) -> tf.Tensor:
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))

    with tf.GradientTape() as tape:
        loss_q = loss_of(net(x, qwz=config))
    ste = tape.gradient(loss_q, net.kernels)

    dequantized = [
        tf.Variable(zoo_layout(net.layer_of(i), quantize_zoo_kernel(net.layer_of(i), k, config)))
        for i, k in enumerate(w.kernel for w in weights if w is not None)
    ]
    biases = [tf.constant(b.numpy()) for b in net.biases]
    with tf.GradientTape() as tape:
        loss_f = loss_of(net.logits(x, dequantized, biases))
    floats = tape.gradient(loss_f, dequantized)
    assert float(loss_q) == float(loss_f)
    for a, b in zip(ste, floats, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
        assert np.abs(a.numpy()).sum() > 0
