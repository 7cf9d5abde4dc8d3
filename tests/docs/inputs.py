"""Input files the documented commands read, made from code in the folder a page's commands run
in (never downloaded): ``python -m tests.docs.inputs NAME [NAME ...]``, which a block asks for
with ``<!-- doctest: prepare NAME -->``.

Each maker writes what a user would have at that point of the page and the page cannot make
with a command of its own: the output of DeepSpeed's ``zero_to_fp32.py`` (one file, and shards
with an index), and the page's own mapping file. Weights are random (seeded): the commands
import and quantize them; what they compute is tested in tests/models/. (The ONNX, Keras and
plain PyTorch inputs of docs/quantized-checkpoints.md are made by the page's own commands.)
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tests.docs.markdown import ROOT, blocks

_RNG_SEED = 20240607
Layers = list[tuple[str, int, int]]  # (tensor prefix, out features, in features)

# docs/quantized-checkpoints.md's zero_to_fp32 example, whose parameter names carry the module
# path: 32 -> 64 -> 10.
ZERO_TO_FP32: Layers = [("encoder.fc1", 64, 32), ("encoder.head", 10, 64)]


def _state_dict(layers: Layers) -> dict[str, np.ndarray]:
    """A PyTorch-layout state dict: Linear weights ``[out, in]``, biases ``[out]``."""
    rng = np.random.default_rng(_RNG_SEED)
    state = {}
    for prefix, out, inp in layers:
        bound = 1.0 / np.sqrt(inp)  # nn.Linear's default initialisation range
        state[f"{prefix}.weight"] = rng.uniform(-bound, bound, (out, inp)).astype(np.float32)
        state[f"{prefix}.bias"] = rng.uniform(-bound, bound, out).astype(np.float32)
    return state


def _save_sharded(state: dict[str, np.ndarray], folder: Path, shards: int = 2) -> None:
    """Shards and ``model.safetensors.index.json`` laid out as ``zero_to_fp32.py`` (and
    ``save_pretrained``) write them."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    names = sorted(state)
    weight_map: dict[str, str] = {}
    for i, part in enumerate(np.array_split(np.array(names), shards), start=1):
        file = f"model-{i:05d}-of-{shards:05d}.safetensors"
        save_file({str(k): state[str(k)] for k in part}, str(folder / file))
        weight_map |= dict.fromkeys((str(k) for k in part), file)
    size = sum(a.nbytes for a in state.values())
    index = {"metadata": {"total_size": size}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def zero_to_fp32_output(folder: Path) -> None:
    """``out/``: the consolidated state dict as one file and as shards with an index."""
    from safetensors.numpy import save_file

    state = _state_dict(ZERO_TO_FP32)
    _save_sharded(state, folder / "out")
    save_file(state, str(folder / "out" / "model.safetensors"))


def arch_toml(folder: Path) -> None:
    """``arch.toml``: the zero_to_fp32 mapping exactly as docs/quantized-checkpoints.md shows it."""
    page = ROOT / "docs" / "quantized-checkpoints.md"
    found = [b for b in blocks(page) if b.lang == "toml" and b.file == "arch.toml"]
    assert len(found) == 1, f"{page}: one toml block marked 'file arch.toml' expected"
    (folder / "arch.toml").write_text(found[0].text, encoding="utf-8")


MAKERS: dict[str, Callable[[Path], None]] = {
    "zero-to-fp32-output": zero_to_fp32_output,
    "arch-toml": arch_toml,
}


def main(names: list[str]) -> int:
    unknown = [n for n in names if n not in MAKERS]
    if unknown or not names:
        print(f"unknown inputs {unknown}; known: {', '.join(MAKERS)}", file=sys.stderr)
        return 2
    for name in names:
        MAKERS[name](Path.cwd())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
