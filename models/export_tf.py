"""Write a ``ModelSpec`` with its weights as a TensorFlow SavedModel.

The serving signature is "serving_default"; its input keys are the spec's input names (one dict
argument, so any number of inputs keeps its names) and its output key is the spec's output name,
exactly as in the ONNX export, so one request body works against either backend.

Importing this module imports TensorFlow (seconds); only the demo builder and tests need it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

# Sets the environment TensorFlow reads when it is first imported (thread pools, log level).
from models import tf_env  # noqa: F401  isort: skip

import tensorflow as tf

from models.zoo import Conv2D, Dense, Flatten, MaxPool2D, ModelSpec, Weights

# The pre-activation output of a Dense or Conv2D layer for its input (bias included): how each
# source of weights (variables here, dequantized codes in ``models.quant_tf``) plugs into
# ``forward``.
LayerFn = Callable[[tf.Tensor], tf.Tensor]


def forward(
    spec: ModelSpec, inputs: Sequence[tf.Tensor], layer_fns: Sequence[LayerFn | None]
) -> tf.Tensor:
    """The model's output for ``inputs`` (in ``spec.inputs`` order), in graph or eager mode."""
    x = inputs[0] if len(inputs) == 1 else tf.concat(list(inputs), axis=-1)
    for layer, fn in zip(spec.layers, layer_fns, strict=True):
        match layer:
            case Dense() | Conv2D():
                assert fn is not None
                x = _activate(fn(x), layer.activation)
            case MaxPool2D(pool=pool):
                x = tf.nn.max_pool2d(x, ksize=pool, strides=layer.step, padding="VALID")
            case Flatten():
                x = tf.reshape(x, [tf.shape(x)[0], -1])
    if spec.softmax:
        x = tf.nn.softmax(x, axis=-1)
    return x


def conv2d(layer: Conv2D, kernel: tf.Tensor, bias: tf.Tensor) -> LayerFn:
    """A Conv2D layer's function for an HWIO kernel."""
    padding = layer.padding.upper()
    return lambda x: tf.nn.bias_add(
        tf.nn.conv2d(x, kernel, strides=layer.stride, padding=padding), bias
    )


def dense(kernel: tf.Tensor, bias: tf.Tensor) -> LayerFn:
    """A Dense layer's function for an ``[in, out]`` kernel."""
    return lambda x: tf.matmul(x, kernel) + bias


def layer_fns_of(
    spec: ModelSpec, params: Sequence[tuple[tf.Tensor, tf.Tensor] | None]
) -> list[LayerFn | None]:
    """Each layer's function for its (kernel, bias) held as tensors or variables (None: a layer
    without weights), in zoo layout."""
    fns: list[LayerFn | None] = []
    for layer, p in zip(spec.layers, params, strict=True):
        if p is None:
            fns.append(None)
        elif isinstance(layer, Conv2D):
            fns.append(conv2d(layer, *p))
        else:
            fns.append(dense(*p))
    return fns


class _Served(tf.Module):
    """Holds the weights as non-trainable variables, so they land in ``variables/``."""

    def __init__(self, spec: ModelSpec, weights: Weights) -> None:
        super().__init__(name=spec.name)
        self._spec = spec
        self._params: list[tuple[tf.Variable, tf.Variable] | None] = []
        for i, p in enumerate(weights):
            if p is None:
                self._params.append(None)
                continue
            kernel = tf.Variable(p.kernel, trainable=False, name=f"l{i}_kernel")
            bias = tf.Variable(p.bias, trainable=False, name=f"l{i}_bias")
            self._params.append((kernel, bias))

    def forward(self, inputs: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        spec = self._spec
        fns = layer_fns_of(spec, self._params)
        return {spec.output: forward(spec, [inputs[i.name] for i in spec.inputs], fns)}


def _activate(x: tf.Tensor, activation: str) -> tf.Tensor:
    return tf.nn.relu(x) if activation == "relu" else x


def export_savedmodel(spec: ModelSpec, weights: Weights, path: Path) -> Path:
    """Write the SavedModel folder ``path`` (must not exist yet) and return it."""
    module = _Served(spec, weights)
    signature = {
        i.name: tf.TensorSpec([None, *i.shape], tf.float32, name=i.name) for i in spec.inputs
    }
    # autograph=False: the layer loop is plain Python over static data, traced once; AutoGraph
    # would only try (and fail noisily) to convert the ``match`` statement.
    serve = tf.function(module.forward, input_signature=[signature], autograph=False)
    tf.saved_model.save(
        module, str(path), signatures={"serving_default": serve.get_concrete_function()}
    )
    return path
