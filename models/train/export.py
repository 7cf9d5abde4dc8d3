"""From a trainer to the block-quantized checkpoint the gateway serves, with no PTQ.

The checkpoint holds exactly the codes and scales the last training forward pass computed
(``Trainer.served_codes``) and the biases that pass used, in ``models.zoo_checkpoint``'s
layout; a run without qwZ exports its fp32 kernels. Both runtimes then compute
``fp32(q * d)`` from those codes: the function the trainer computed with.

``ptq_weights`` is the baseline the report compares against: the fp32 model's weights quantized
after training with the same quantizer and layout (round to nearest, nothing retrained).
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from models.checkpoint import Checkpoint, Tensor, save_checkpoint
from models.repository import CONFIG_FILE, ModelConfig
from models.zoo import ModelSpec, Params, Weights
from models.zoo_checkpoint import (
    bias_name,
    dequantized_weights,
    quantize_kernel,
    to_input_major,
    to_output_major,
    weight_name,
    zoo_architecture,
    zoo_params,
)

if TYPE_CHECKING:
    from models.train.trainer import Trainer


def trained_checkpoint(trainer: Trainer, *, softmax: bool = True) -> Checkpoint:
    """The checkpoint of what the trainer's last forward pass computed. ``softmax=False``
    serves logits instead of probabilities (same weights)."""
    spec = replace(trainer.spec, softmax=softmax)
    codes = trainer.served_codes()
    served = trainer.served_weights()
    tensors: dict[str, Tensor] = {}
    for position, index in enumerate(trainer.network.param_layers):
        p = served[index]
        assert p is not None
        layer = spec.layers[index]
        quantized = codes.get(position)
        tensors[weight_name(index)] = (
            quantized if quantized is not None else to_output_major(layer, p.kernel)
        )
        tensors[bias_name(index)] = np.ascontiguousarray(p.bias, dtype=np.float32)
    return Checkpoint(architecture=zoo_architecture(spec), tensors=tensors)


def export_checkpoint(trainer: Trainer, path: Path, *, softmax: bool = True) -> Path:
    """Write ``trained_checkpoint(trainer)`` to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return save_checkpoint(trained_checkpoint(trainer, softmax=softmax), path)


def check_version_dir(version_dir: Path) -> None:
    """Raise unless ``version_dir`` has the shape the gateway scans: ``<repo>/<model>/<n>``."""
    if not (version_dir.name.isdigit() and int(version_dir.name) >= 1):
        raise ValueError(
            "--serve-dir must be <repo>/<model>/<version> with a version number >= 1, "
            f"got {version_dir} (e.g. models/digits/1)"
        )


def export_serving_folder(
    trainer: Trainer, version_dir: Path, *, runtime: str = "onnxruntime", softmax: bool = True
) -> Path:
    """Write a ready-to-serve model version: ``version_dir/model.safetensors`` and the
    ``config.toml`` (``format = "checkpoint"``) that makes ``iotgw serve --model-repo <repo>``
    serve it. ``version_dir`` is ``<repo>/<model>/<version>``; returns the config's path."""
    check_version_dir(version_dir)
    # The keys that matter, and no more: every other setting keeps its documented default.
    text = (
        f"runtime = {json.dumps(runtime)}\n"
        'path = "model.safetensors"\n'
        'format = "checkpoint"\n'
        'description = "digits CNN trained by iotgw train (input image [N, 8, 8, 1] in [0, 1])"\n'
    )
    config = ModelConfig.model_validate(tomllib.loads(text))  # what the gateway will read
    export_checkpoint(trainer, version_dir / config.path, softmax=softmax)
    # Written last: the gateway takes a version folder with a config.toml as complete.
    target = version_dir / CONFIG_FILE
    target.write_text(text, encoding="utf-8")
    return target


def checkpoint_weights(checkpoint: Checkpoint, path: Path) -> tuple[ModelSpec, Weights]:
    """The float weights a checkpoint computes with (quantized kernels dequantized)."""
    spec, params = zoo_params(checkpoint, path)
    return spec, dequantized_weights(spec, params)


def ptq_weights(spec: ModelSpec, weights: Weights, bits: int, block_size: int) -> Weights:
    """Round-to-nearest post-training quantization of every kernel (biases stay float): the
    weights a checkpoint of the fp32 model quantized after training would compute with."""
    out: list[Params | None] = []
    for layer, p in zip(spec.layers, weights, strict=True):
        if p is None:
            out.append(None)
            continue
        q = quantize_kernel(to_output_major(layer, p.kernel), bits, block_size)
        out.append(Params(to_input_major(layer, q.dequantize()), p.bias))
    return tuple(out)
