"""Import a Keras model: a chain of Dense, Conv2D, MaxPooling2D and Flatten layers.

The model may be a ``keras.Model`` object or a ``.keras`` file, which is loaded with
``safe_mode=True`` (no Lambda layers, no arbitrary code) and without compiling. Keras keeps
images NHWC, kernels ``[in, out]`` and HWIO, and flattens in (H, W, C) order, exactly as the
zoo does, so the weights carry over as they are; the checkpoint stores them output-major.

A ReLU written as its own layer (``Activation("relu")``, ``ReLU()``) folds into the layer
before it; a softmax may only end the model. Dropout does nothing at inference and is skipped.
Importing this module imports Keras and TensorFlow.
"""

from __future__ import annotations

# Sets the environment TensorFlow reads when it is first imported (Keras imports it).
from models import tf_env  # noqa: F401  isort: skip

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import keras
import numpy as np

from models.checkpoint import Checkpoint
from models.importers.report import ImportFailed, ImportReport, QuantOptions, architecture_lines
from models.importers.zoo_import import quantize_zoo
from models.zoo import (
    Activation,
    Conv2D,
    Dense,
    Flatten,
    Input,
    Layer,
    MaxPool2D,
    ModelSpec,
    Params,
)

_SKIPPED = ("InputLayer", "Dropout", "SpatialDropout1D", "SpatialDropout2D", "GaussianDropout")


def load_keras(path: Path) -> keras.Model:
    try:
        model = keras.saving.load_model(str(path), compile=False, safe_mode=True)
    except Exception as exc:  # Keras raises many kinds (ValueError, OSError, zipfile errors)
        raise ImportFailed(f"{path}: Keras cannot load it: {exc}") from exc
    if not isinstance(model, keras.Model):
        raise ImportFailed(f"{path}: not a Keras model")
    return model


def import_keras(
    source: keras.Model | Path,
    options: QuantOptions,
    *,
    input_name: str | None = None,
    output_name: str = "probabilities",
) -> tuple[Checkpoint, ImportReport]:
    model = source if isinstance(source, keras.Model) else load_keras(Path(source))
    description = f"Keras model {model.name!r}" + (
        "" if isinstance(source, keras.Model) else f" from {source}"
    )
    if len(model.inputs) != 1 or len(model.outputs) != 1:
        raise ImportFailed(f"{description}: only single-input, single-output models")
    shape = tuple(model.inputs[0].shape[1:])
    if any(d is None for d in shape):
        raise ImportFailed(f"{description}: the input shape {shape} must be fully known")
    _check_chain(model, description)
    chain = _Chain()
    for klayer in model.layers:
        chain.add(klayer)
    try:
        spec = ModelSpec(
            name=model.name,
            inputs=(Input(input_name or model.inputs[0].name, shape),),
            layers=tuple(chain.layers),
            output=output_name,
            softmax=chain.softmax,
            description=f"imported from {description}",
        )
    except ValueError as exc:
        raise ImportFailed(f"{description}: {exc}") from exc
    checkpoint, decisions = quantize_zoo(spec, tuple(chain.weights), options, chain.sources)
    notes = tuple(chain.notes)
    report = ImportReport(description, tuple(decisions), notes, architecture_lines(spec))
    return checkpoint, report


@dataclass(slots=True)
class _Chain:
    """The zoo layers made of the Keras layers so far, their weights and where they came from."""

    layers: list[Layer] = field(default_factory=list)
    weights: list[Params | None] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    softmax: bool = False  # the model ends with a softmax: nothing may follow

    def add(self, klayer: Any) -> None:
        kind = type(klayer).__name__
        if kind in _SKIPPED:
            if kind != "InputLayer":
                self.notes.append(f"{klayer.name} ({kind}) skipped: does nothing at inference")
            return
        if self.softmax:
            raise ImportFailed(f"{klayer.name}: a softmax may only end the model")
        config = klayer.get_config()
        activation = _activation(config)
        if kind in ("Activation", "ReLU", "Softmax"):
            if kind == "ReLU" and any(
                config.get(k) for k in ("max_value", "negative_slope", "threshold")
            ):
                raise ImportFailed(f"{klayer.name}: only a plain ReLU is supported")
            name = {"ReLU": "relu", "Softmax": "softmax"}.get(kind, activation)
            self.softmax = _fold(self.layers, name, klayer.name)
            return
        layer, params = _convert(klayer, kind, config)
        if activation == "softmax":
            self.softmax = True
        elif activation not in ("linear", "relu"):
            raise ImportFailed(f"{klayer.name}: activation {activation!r} is not supported")
        if params is not None:
            self.sources[f"layers.{len(self.layers)}.weight"] = f"{klayer.name}.kernel"
            self.sources[f"layers.{len(self.layers)}.bias"] = f"{klayer.name}.bias"
        self.layers.append(layer)
        self.weights.append(params)


def _check_chain(model: keras.Model, description: str) -> None:
    """Refuse anything but a plain chain (branches, merges, shared layers). A Sequential model
    is one by construction; a functional model's config names each layer's inputs."""
    if isinstance(model, keras.Sequential):
        return
    previous = None
    for layer in model.get_config().get("layers", []):
        nodes = layer.get("inbound_nodes", [])
        if previous is not None:
            try:
                (node,) = nodes
                (arg,) = node["args"]
                source = arg["config"]["keras_history"][0]
            except (ValueError, KeyError, TypeError, IndexError):
                source = None
            if source != previous or node.get("kwargs"):
                raise ImportFailed(
                    f"{description}: {layer.get('name')} does not simply follow {previous}: "
                    "only chains of layers are supported"
                )
        previous = layer.get("name")


def _activation(config: dict[str, Any]) -> str:
    activation = config.get("activation", "linear")
    if activation is None:
        return "linear"
    if not isinstance(activation, str):
        raise ImportFailed(f"{config.get('name')}: activation {activation!r} is not supported")
    return activation


def _fold(layers: list[Layer], activation: str, name: str) -> bool:
    """Fold a standalone activation into the previous layer; returns whether it was a softmax."""
    if activation == "softmax":
        return True
    if activation == "linear":
        return False
    last = layers[-1] if layers else None
    if activation != "relu" or not isinstance(last, Dense | Conv2D) or last.activation != "linear":
        raise ImportFailed(f"{name}: activation {activation!r} cannot follow {last}")
    if isinstance(last, Dense):
        layers[-1] = Dense(last.units, "relu")
    else:
        layers[-1] = Conv2D(last.filters, last.kernel, last.stride, last.padding, "relu")
    return False


def _convert(layer: Any, kind: str, config: dict[str, Any]) -> tuple[Layer, Params | None]:
    name = layer.name
    activation = _activation(config)
    act: Activation
    if activation in ("linear", "softmax"):  # a final softmax is folded away (argmax kept)
        act = "linear"
    elif activation == "relu":
        act = "relu"
    else:
        raise ImportFailed(f"{name}: activation {activation!r} is not supported")
    if kind == "Dense":
        return Dense(config["units"], act), _params(layer, config)
    if kind == "Conv2D":
        size, stride = _square(config["kernel_size"], name), _square(config["strides"], name)
        if _square(config["dilation_rate"], name) != 1 or config.get("groups", 1) != 1:
            raise ImportFailed(f"{name}: dilated or grouped convolutions are not supported")
        _channels_last(config, name)
        return Conv2D(config["filters"], size, stride, config["padding"], act), _params(
            layer, config
        )
    if kind == "MaxPooling2D":
        _channels_last(config, name)
        if config["padding"] != "valid":
            raise ImportFailed(f"{name}: only valid max pooling is supported")
        pool = _square(config["pool_size"], name)
        stride = _square(config["strides"] or config["pool_size"], name)
        return MaxPool2D(pool, None if stride == pool else stride), None
    if kind == "Flatten":
        _channels_last(config, name)
        return Flatten(), None
    raise ImportFailed(
        f"{name} ({kind}) has no counterpart in the zoo; supported: Dense, Conv2D, "
        f"MaxPooling2D, Flatten, Activation/ReLU/Softmax, Dropout"
    )


def _params(layer: Any, config: dict[str, Any]) -> Params:
    values = [np.asarray(v) for v in layer.get_weights()]
    kernel = values[0]
    bias = values[1] if config.get("use_bias", True) else np.zeros(kernel.shape[-1], kernel.dtype)
    return Params(kernel, bias)


def _square(value: Any, name: str) -> int:
    pair = tuple(value) if isinstance(value, list | tuple) else (value, value)
    if len(pair) != 2 or pair[0] != pair[1]:
        raise ImportFailed(f"{name}: only square kernels, pools and strides, got {value}")
    return int(pair[0])


def _channels_last(config: dict[str, Any], name: str) -> None:
    if config.get("data_format", "channels_last") != "channels_last":
        raise ImportFailed(f"{name}: only channels_last data is supported")
