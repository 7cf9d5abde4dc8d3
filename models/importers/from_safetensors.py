"""Import a float safetensors state dict (e.g. DeepSpeed's consolidated fp32 weights).

``zero_to_fp32.py <checkpoint_dir> <out> --safe_serialization`` writes ``model.safetensors``, or
shards plus ``model.safetensors.index.json`` (``{"weight_map": {tensor: shard file}}``) for
large models. Either (a file, the index, or the folder holding them) is a source here.

PyTorch state dicts carry no architecture, so an architecture mapping says what the tensors
are and what ``forward()`` does between them: a ``ModelSpec`` description
(``models.spec_codec``) whose Dense and Conv2D layers name their ``weight`` and optional
``bias`` tensors. Nothing that changes the model is guessed: every dense and conv2d layer but
the last states its ``activation`` (the last defaults to linear, a head's logits), and a
softmax is appended only when the mapping says ``softmax = true`` (the output is then
``probabilities``, else ``logits``). The import report lists each layer's activation and the
output. The format, with examples, is in docs/quantized-checkpoints.md.

Weights are in PyTorch's layout, which is the checkpoint's: Linear ``[out, in]``, Conv2d
``[O, I, kh, kw]``. A PyTorch CNN flattens NCHW feature maps, so its first Linear after the
flatten reads inputs in (C, H, W) order: mark that flatten ``{"type": "flatten", "order":
"chw"}`` and the importer reorders that Linear's columns to the zoo's (H, W, C) order.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError, safe_open

from models.checkpoint import Checkpoint
from models.importers.report import (
    ImportFailed,
    ImportReport,
    QuantOptions,
    architecture_lines,
)
from models.importers.zoo_import import quantize_zoo
from models.spec_codec import SpecError, spec_from_doc
from models.zoo import Dense, ModelSpec, Params, layer_shapes
from models.zoo_checkpoint import bias_name, kernel_shapes, to_input_major, weight_name

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
_FLOAT_KINDS = ("float32", "float16", "bfloat16", "float64")


class StateDict:
    """Tensor name -> the safetensors file holding it; tensors are read on demand."""

    def __init__(self, files: Mapping[str, Path], description: str) -> None:
        self.files = dict(files)
        self.description = description

    @classmethod
    def open(cls, source: Path) -> StateDict:
        source = Path(source)
        if source.is_dir():
            if (source / INDEX_FILE).is_file():
                return cls._from_index(source / INDEX_FILE)
            if (source / SINGLE_FILE).is_file():
                return cls._from_file(source / SINGLE_FILE)
            raise ImportFailed(f"{source}: holds neither {INDEX_FILE} nor {SINGLE_FILE}")
        if not source.is_file():
            raise ImportFailed(f"{source}: no such file")
        if source.name.endswith(".json"):
            return cls._from_index(source)
        return cls._from_file(source)

    @classmethod
    def _from_file(cls, path: Path) -> StateDict:
        return cls({name: path for name in _keys(path)}, str(path))

    @classmethod
    def _from_index(cls, index: Path) -> StateDict:
        try:
            doc = json.loads(index.read_text(encoding="utf-8"))
            weight_map = doc["weight_map"]
            if not isinstance(weight_map, dict):
                raise TypeError("weight_map is not an object")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ImportFailed(f"{index}: not a safetensors index ({exc})") from exc
        files: dict[str, Path] = {}
        shard_keys: dict[Path, set[str]] = {}
        for name, shard in weight_map.items():
            path = index.parent / str(shard)
            if path.parent != index.parent:  # a shard outside the index's folder is suspicious
                raise ImportFailed(f"{index}: shard {shard!r} of {name!r} is not beside the index")
            if path not in shard_keys:
                if not path.is_file():
                    raise ImportFailed(f"{index}: shard {shard} (holding {name!r}) is missing")
                shard_keys[path] = set(_keys(path))
            if name not in shard_keys[path]:
                raise ImportFailed(f"{index}: {name!r} is not in its shard {shard}")
            files[name] = path
        return cls(files, f"{index} ({len(shard_keys)} shards)")

    def get(self, name: str) -> np.ndarray:
        path = self.files.get(name)
        if path is None:
            raise ImportFailed(f"the state dict has no tensor {name!r}")
        try:
            with safe_open(str(path), framework="np") as fh:
                array: np.ndarray = fh.get_tensor(name)
        except SafetensorError as exc:
            raise ImportFailed(f"{path}: cannot read {name!r}: {exc}") from exc
        if array.dtype.name not in _FLOAT_KINDS:
            raise ImportFailed(f"{name!r} is {array.dtype}, not a float tensor")
        return array


def _keys(path: Path) -> list[str]:
    try:
        with safe_open(str(path), framework="np") as fh:
            return list(fh.keys())
    except SafetensorError as exc:
        raise ImportFailed(f"{path}: not a valid safetensors file: {exc}") from exc


def read_mapping(source: Path | Mapping[str, Any]) -> dict[str, Any]:
    """An architecture mapping from a JSON or TOML file (or already parsed)."""
    if isinstance(source, Mapping):
        return dict(source)
    try:
        text = Path(source).read_text(encoding="utf-8")
        doc = tomllib.loads(text) if str(source).endswith(".toml") else json.loads(text)
    except (OSError, ValueError) as exc:  # TOMLDecodeError and JSONDecodeError are ValueErrors
        raise ImportFailed(f"{source}: cannot read the architecture mapping: {exc}") from exc
    if not isinstance(doc, dict):
        raise ImportFailed(f"{source}: the architecture mapping is not an object")
    return doc


def import_state_dict(
    source: Path, mapping: Path | Mapping[str, Any], options: QuantOptions
) -> tuple[Checkpoint, ImportReport]:
    state = StateDict.open(source)
    parsed = _parse_mapping(read_mapping(mapping))
    spec, tensor_names, chw = parsed.spec, parsed.tensors, parsed.chw
    weights: list[Params | None] = []
    source_names: dict[str, str] = {}
    notes: list[str] = []
    used: set[str] = set()
    shapes = layer_shapes(spec)
    for index, (layer, kernel_shape) in enumerate(
        zip(spec.layers, kernel_shapes(spec), strict=True)
    ):
        if kernel_shape is None:
            weights.append(None)
            continue
        weight_src, bias_src = tensor_names[index]
        weight = state.get(weight_src)
        used.add(weight_src)
        if tuple(weight.shape) != kernel_shape:
            raise ImportFailed(
                f"{weight_src!r} has shape {list(weight.shape)}; layer {index} ({layer}) needs "
                f"{list(kernel_shape)} (PyTorch layout: [out, in] or [O, I, kh, kw])"
            )
        if isinstance(layer, Dense) and index - 1 in chw:
            h, w, c = shapes[index - 2] if index >= 2 else spec.inputs[0].shape
            weight = weight.reshape(-1, c, h, w).transpose(0, 2, 3, 1).reshape(weight.shape[0], -1)
            notes.append(f"{weight_src}: columns reordered from (C, H, W) to (H, W, C)")
        if bias_src is None:
            bias = np.zeros(kernel_shape[0], weight.dtype)
            notes.append(f"layer {index} has no bias in the source: zeros")
        else:
            bias = state.get(bias_src)
            used.add(bias_src)
            if tuple(bias.shape) != (kernel_shape[0],):
                raise ImportFailed(
                    f"{bias_src!r} has shape {list(bias.shape)}; layer {index} needs "
                    f"[{kernel_shape[0]}]"
                )
            source_names[bias_name(index)] = bias_src
        source_names[weight_name(index)] = weight_src
        weights.append(Params(to_input_major(layer, weight), bias))
    ignored = sorted(set(state.files) - used)
    if ignored:
        shown = ", ".join(ignored[:8]) + (
            f" and {len(ignored) - 8} more" if len(ignored) > 8 else ""
        )
        notes.append(f"ignored (not in the architecture mapping): {shown}")
    checkpoint, decisions = quantize_zoo(spec, tuple(weights), options, source_names)
    architecture = architecture_lines(spec, parsed.remarks)
    return checkpoint, ImportReport(state.description, tuple(decisions), tuple(notes), architecture)


@dataclass(frozen=True, slots=True)
class _Mapping:
    spec: ModelSpec
    tensors: dict[int, tuple[str, str | None]]
    """Per parameterised layer, its (weight, bias) tensor names."""
    chw: set[int]
    """Indices of flatten layers marked ``order = "chw"``."""
    remarks: dict[int, str]
    """Per layer, what the import report adds to its line."""


def _layer_entry(index: int, raw: Any, last: bool) -> tuple[dict[str, Any], str | None]:
    """The layer's spec entry (tensor names and order removed, the head's activation
    filled in) and the remark on a defaulted activation."""
    if not isinstance(raw, dict):
        raise ImportFailed(f"layers[{index}] is not an object")
    layer = {k: v for k, v in raw.items() if k not in ("weight", "bias", "order")}
    if layer.get("type") not in ("dense", "conv2d") or "activation" in layer:
        return layer, None
    if last:
        # The model's last layer computes the logits: a PyTorch head is a bare Linear.
        return {**layer, "activation": "linear"}, " (activation: default of the last layer)"
    raise ImportFailed(
        f"layers[{index}] ({layer['type']} {raw.get('weight')!r}) needs an 'activation' key: "
        '"relu" or "linear" (a state dict does not record the activations of forward(); only '
        "the last layer defaults to linear)"
    )


def _tensor_names(index: int, raw: dict[str, Any]) -> tuple[str, str | None] | None:
    weight, bias, kind = raw.get("weight"), raw.get("bias"), raw.get("type")
    if kind in ("dense", "conv2d"):
        if not isinstance(weight, str) or not (bias is None or isinstance(bias, str)):
            raise ImportFailed(
                f"layers[{index}] ({kind}) needs a 'weight' tensor name (and may name a 'bias')"
            )
        return weight, bias
    if weight is not None or bias is not None:
        raise ImportFailed(f"layers[{index}] ({kind}) has no parameters to map")
    return None


def _is_chw(index: int, raw: dict[str, Any]) -> bool:
    order = raw.get("order")
    if order is None:
        return False
    if raw.get("type") != "flatten" or order not in ("hwc", "chw"):
        raise ImportFailed(f"layers[{index}]: 'order' is for flatten layers: hwc or chw")
    return bool(order == "chw")


def _parse_mapping(doc: Mapping[str, Any]) -> _Mapping:
    """The mapping's spec and tensor names. Logits unless ``softmax = true``; an activation
    stated on every dense and conv2d layer but the last (linear by default)."""
    layers = doc.get("layers")
    if not isinstance(layers, list) or not layers:
        raise ImportFailed("the architecture mapping needs a non-empty list of layers")
    stripped: list[Any] = []
    names: dict[int, tuple[str, str | None]] = {}
    chw: set[int] = set()
    remarks: dict[int, str] = {}
    for index, raw in enumerate(layers):
        layer, remark = _layer_entry(index, raw, last=index == len(layers) - 1)
        stripped.append(layer)
        if (tensors := _tensor_names(index, raw)) is not None:
            names[index] = tensors
            remarks[index] = f" <- {', '.join(t for t in tensors if t)}{remark or ''}"
        if _is_chw(index, raw):
            chw.add(index)
    softmax = doc.get("softmax", False)
    top = {"softmax": softmax, "output": "probabilities" if softmax is True else "logits"}
    try:
        spec = spec_from_doc({**top, **doc, "layers": stripped})
    except SpecError as exc:
        raise ImportFailed(str(exc)) from exc
    for index in chw:
        following = spec.layers[index + 1] if index + 1 < len(spec.layers) else None
        before = layer_shapes(spec)[index - 1] if index else spec.inputs[0].shape
        if not isinstance(following, Dense) or len(before) != 3:
            raise ImportFailed(
                f"layers[{index}]: a chw flatten must sit between a feature map and a dense layer"
            )
    return _Mapping(spec, names, chw, remarks)
