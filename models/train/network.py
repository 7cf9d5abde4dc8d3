"""A zoo ``ModelSpec`` as a Keras 3 model whose kernels can pass through qwZ.

The parameters are Keras variables (fp32 master weights, zoo layout); the forward pass uses the
same TensorFlow layer functions as the served TensorFlow graph (``models.export_tf``), so the
trainer and the gateway's TensorFlow runtime compute a layer with the same ops.

``qwz_kernel`` is the quantized layer's weight path: forward ``dequant(quant(W))`` with
``models.quant``'s rule run on the host (``tf.numpy_function``: the one quantizer, not a
restatement of it), backward the straight-through estimator (the gradient with respect to the
dequantized weight is applied to the master weight unchanged).

Importing this module imports TensorFlow.
"""

from __future__ import annotations

# Sets the environment TensorFlow reads when it is first imported (thread pools, log level).
from models import tf_env  # noqa: F401  isort: skip

from collections.abc import Callable, Sequence
from dataclasses import replace

import keras
import numpy as np
import tensorflow as tf

from models.checkpoint import QuantizedTensor
from models.export_tf import forward, layer_fns_of
from models.train.qwz import QwZConfig, quantize_zoo_kernel, zoo_layout
from models.zoo import Layer, ModelSpec, Params, Weights

Recorder = Callable[[QuantizedTensor], None]


def qwz_kernel(
    kernel: tf.Tensor, layer: Layer, config: QwZConfig, record: Recorder | None = None
) -> tf.Tensor:
    """``dequant(quant(kernel))`` with a straight-through gradient; ``record`` receives the
    codes and scales each time the forward pass computes them."""

    def host(w: np.ndarray) -> np.ndarray:
        quantized = quantize_zoo_kernel(layer, w, config)
        if record is not None:
            record(quantized)
        return zoo_layout(layer, quantized)

    @tf.custom_gradient
    def fake_quant(w: tf.Tensor) -> tuple[tf.Tensor, Callable[[tf.Tensor], tf.Tensor]]:
        # stateful: the recorder is a side effect, so the call must never be pruned or merged.
        wq = tf.numpy_function(host, [w], tf.float32, stateful=True)
        wq.set_shape(w.shape)

        def straight_through(upstream: tf.Tensor) -> tf.Tensor:
            return upstream

        return wq, straight_through

    return fake_quant(kernel)


def logits_spec(spec: ModelSpec) -> ModelSpec:
    """The same model without its softmax: training and comparisons work on logits."""
    return replace(spec, softmax=False)


def forward_logits(spec: ModelSpec, weights: Weights, x: np.ndarray) -> np.ndarray:
    """Logits of float zoo-layout ``weights`` for a batch (eager TensorFlow, same ops as the
    training step and the served TensorFlow graph)."""
    params = [None if p is None else (tf.constant(p.kernel), tf.constant(p.bias)) for p in weights]
    out = forward(logits_spec(spec), [tf.constant(x, tf.float32)], layer_fns_of(spec, params))
    return out.numpy()


class ZooNetwork(keras.Model):
    """The master weights of a zoo model and its forward pass (logits)."""

    def __init__(self, spec: ModelSpec, weights: Weights) -> None:
        super().__init__(name=spec.name)
        self.spec = spec
        self.param_layers: list[int] = [i for i, p in enumerate(weights) if p is not None]
        self.kernels: list[keras.Variable] = []
        self.biases: list[keras.Variable] = []
        for index in self.param_layers:
            p = weights[index]
            assert p is not None
            self.kernels.append(self._variable(f"l{index}_kernel", p.kernel))
            self.biases.append(self._variable(f"l{index}_bias", p.bias))

    def _variable(self, name: str, value: np.ndarray) -> keras.Variable:
        var = self.add_weight(shape=value.shape, initializer="zeros", dtype="float32", name=name)
        var.assign(value.astype(np.float32))
        return var

    @property
    def parameters(self) -> list[keras.Variable]:
        """Kernels and biases interleaved, layer by layer: the order of every gradient list."""
        return [v for pair in zip(self.kernels, self.biases, strict=True) for v in pair]

    def layer_of(self, position: int) -> Layer:
        """The zoo layer of the ``position``-th parameterised layer."""
        return self.spec.layers[self.param_layers[position]]

    def logits(self, x: tf.Tensor, kernels: Sequence[tf.Tensor], biases: Sequence[tf.Tensor]):
        """Logits for ``x`` with the given (possibly dequantized) kernels and biases."""
        params: list[tuple[tf.Tensor, tf.Tensor] | None] = [None] * len(self.spec.layers)
        for position, index in enumerate(self.param_layers):
            params[index] = (kernels[position], biases[position])
        return forward(logits_spec(self.spec), [x], layer_fns_of(self.spec, params))

    def call(self, x: tf.Tensor, qwz: QwZConfig | None = None) -> tf.Tensor:
        """Logits; with ``qwz`` every kernel (at least ``qwz.min_elements`` big) goes through
        ``qwz_kernel``."""
        kernels = [tf.convert_to_tensor(k) for k in self.kernels]
        if qwz is not None:
            kernels = [
                qwz_kernel(k, self.layer_of(i), qwz) if qwz.quantizes(int(np.prod(k.shape))) else k
                for i, k in enumerate(kernels)
            ]
        return self.logits(x, kernels, [tf.convert_to_tensor(b) for b in self.biases])

    def master_weights(self) -> Weights:
        """The fp32 master weights as zoo ``Params`` (numpy copies)."""
        out: list[Params | None] = [None] * len(self.spec.layers)
        for position, index in enumerate(self.param_layers):
            out[index] = Params(
                np.array(self.kernels[position].numpy()), np.array(self.biases[position].numpy())
            )
        return tuple(out)
