"""``iotgw quantize`` (import into a block-quantized checkpoint) and ``iotgw inspect``."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from models.checkpoint import CheckpointError, save_checkpoint
from models.checkpoint_summary import CheckpointSummary, summarize
from models.importers.report import ImportFailed, ImportReport, QuantOptions
from models.quant import SUPPORTED_BITS, QuantizationError
from models.serving_plan import (
    DEFAULT_WEIGHT_MEMORY_BUDGET,
    PLAN_HEADERS,
    PlanOptions,
    ServingPlan,
)

# iotgw serve's default cache folder (``serving.cache_dir``), where plans' costs are cached.
DEFAULT_CACHE_DIR = Path.home() / ".cache" / "iotgw"


def quantize_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="iotgw quantize",
        description="Import float weights into a block-quantized checkpoint (qwZ's rule, blocks "
        "along each kernel's input dimension) that `iotgw serve` runs on ONNX Runtime or "
        "TensorFlow with the weights kept quantized in memory.",
    )
    sub = p.add_subparsers(dest="source", required=True)
    st = sub.add_parser(
        "safetensors",
        help="a safetensors state dict (file, index json or folder), e.g. DeepSpeed's "
        "zero_to_fp32.py --safe_serialization output",
    )
    st.add_argument("src", type=Path)
    st.add_argument(
        "--mapping",
        type=Path,
        required=True,
        help="architecture mapping (JSON or TOML): the model's layers and their tensor names",
    )
    keras = sub.add_parser("keras", help="a .keras model file (loaded in safe mode)")
    keras.add_argument("src", type=Path)
    keras.add_argument("--input-name", help="name of the model input (default: Keras's)")
    keras.add_argument("--output-name", default="probabilities", help="name of the output")
    onnx = sub.add_parser(
        "onnx", help="an fp32 ONNX model (MatMul/Gemm/Conv weights; ONNX Runtime only)"
    )
    onnx.add_argument("src", type=Path)
    for s in (st, keras, onnx):
        s.add_argument("-o", "--out", type=Path, required=True, help="checkpoint file to write")
        s.add_argument("--bits", type=int, choices=SUPPORTED_BITS, default=4)
        s.add_argument("--block-size", type=int, default=128, help="power of two, 16 to 4096")
        s.add_argument(
            "--keep-float",
            action="append",
            default=[],
            metavar="PATTERN",
            help="keep tensors whose name matches this shell pattern in float (repeatable)",
        )
        s.add_argument("--min-elements", type=int, default=0, help="keep smaller weights in float")
        s.add_argument(
            "--config",
            choices=["onnxruntime", "tensorflow"],
            help="also write config.toml beside the checkpoint, making its folder a model "
            "version served by this runtime",
        )
    return p


def quantize_main(argv: Sequence[str]) -> int:
    args = quantize_parser().parse_args(list(argv))
    try:
        options = QuantOptions(
            args.bits, args.block_size, tuple(args.keep_float), args.min_elements
        )
        if args.source == "safetensors":
            from models.importers.from_safetensors import import_state_dict

            checkpoint, report = import_state_dict(args.src, args.mapping, options)
        elif args.source == "keras":
            from models.importers.from_keras import import_keras

            checkpoint, report = import_keras(
                args.src, options, input_name=args.input_name, output_name=args.output_name
            )
        else:
            from models.importers.from_onnx import import_onnx

            checkpoint, report = import_onnx(args.src, options)
        if args.config == "tensorflow" and checkpoint.architecture.get("kind") != "zoo":
            raise ImportFailed("an imported ONNX graph is served by onnxruntime only")
        path = save_checkpoint(checkpoint, args.out)
    except (ImportFailed, QuantizationError) as exc:
        print(f"iotgw quantize: {exc}", file=sys.stderr)
        return 2
    print(report.format())
    print(_size_line(path, report))
    if args.config:
        print(f"wrote {_write_config(path, args.config)}")
    return 0


def _size_line(path: Path, report: ImportReport) -> str:
    float_bytes = sum(4 * math.prod(d.shape) for d in report.decisions)
    size = path.stat().st_size
    ratio = size / float_bytes if float_bytes else float("nan")
    return f"wrote {path}: {size:,} bytes ({ratio:.3f} of the {float_bytes:,} bytes as float32)"


def _write_config(path: Path, runtime: str) -> Path:
    from models.demo import config_toml
    from models.repository import CONFIG_FILE, ModelConfig

    config = ModelConfig.model_validate(
        {"runtime": runtime, "path": path.name, "format": "checkpoint"}
    )
    target = path.parent / CONFIG_FILE
    target.write_text(config_toml(config), encoding="utf-8")
    return target


# -- inspect -----------------------------------------------------------------------------------


def inspect_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="iotgw inspect",
        description="Summarize a checkpoint: architecture, tensors, bits, blocks, sizes, and "
        "whether every tensor matches its checksum and the quantizer's invariants. Exits 1 "
        "when a tensor is damaged, 2 when the file cannot be read at all.",
    )
    p.add_argument("checkpoint", type=Path)
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument(
        "--plan",
        choices=["onnxruntime", "tensorflow"],
        help="also show the serving plan this runtime follows on this machine: how each "
        "quantized tensor runs, its measured times every way (at batch 1, 8 and 32), and the "
        "bytes it holds (costs measured now, or read from the cache iotgw serve shares)",
    )
    p.add_argument(
        "--weight-memory-budget",
        type=float,
        default=DEFAULT_WEIGHT_MEMORY_BUDGET,
        help="the plan's budget, a fraction of the fp32 weights (as iotgw serve's; default "
        f"{DEFAULT_WEIGHT_MEMORY_BUDGET})",
    )
    p.add_argument(
        "--cache-dir",
        type=Path,
        default=DEFAULT_CACHE_DIR,
        help="iotgw serve's cache folder, whose plans/ holds measured costs (default "
        f"{DEFAULT_CACHE_DIR})",
    )
    return p


def inspect_main(argv: Sequence[str]) -> int:
    args = inspect_parser().parse_args(list(argv))
    try:
        summary = summarize(args.checkpoint)
    except CheckpointError as exc:
        print(f"iotgw inspect: {exc}", file=sys.stderr)
        return 2
    plan = None
    if args.plan and summary.ok:
        options = PlanOptions(args.weight_memory_budget, args.cache_dir / "plans")
        plan = serving_plan(args.checkpoint, args.plan, options)
    if args.json:
        doc = summary_doc(summary)
        if args.plan:
            doc["serving_plan"] = None if plan is None else plan.as_doc()
        print(json.dumps(doc, indent=1))
    else:
        print(format_summary(summary))
        if args.plan:
            print("\n" + format_plan(args.plan, plan))
    return 0 if summary.ok else 1


def serving_plan(path: Path, runtime: str, options: PlanOptions) -> ServingPlan | None:
    """The plan ``runtime`` follows for the checkpoint here (None: an imported ONNX graph,
    whose weights run the way the import rewrote them)."""
    from models.checkpoint import ZOO_KIND, load_checkpoint
    from models.serving_plan import CostCache
    from models.zoo_checkpoint import zoo_params

    checkpoint = load_checkpoint(path)
    if checkpoint.architecture.get("kind") != ZOO_KIND:
        return None
    spec, params = zoo_params(checkpoint, path)
    cache = CostCache(options.cache_dir)
    if runtime == "onnxruntime":
        from models.plan_onnx import onnx_plan
        from models.quant_onnx import DEFAULT_ACCURACY_LEVEL

        level = DEFAULT_ACCURACY_LEVEL
        return onnx_plan(spec, params, budget=options.budget, accuracy_level=level, cache=cache)
    from models.plan_tf import tf_plan

    return tf_plan(spec, params, budget=options.budget, cache=cache)


def format_plan(runtime: str, plan: ServingPlan | None) -> str:
    from models.reporting import format_table

    if plan is None:
        return f"serving plan on {runtime}: none (an imported graph runs as imported)"
    head = f"serving plan on {runtime}: {plan.summary()}"
    return head + "\n" + format_table(list(PLAN_HEADERS), plan.rows())


def summary_doc(summary: CheckpointSummary) -> dict[str, Any]:
    return {
        "path": str(summary.path),
        "format_version": summary.format_version,
        "file_bytes": summary.file_bytes,
        "architecture": _architecture_line(summary.architecture),
        "ok": summary.ok,
        "tensors": [
            {
                "name": t.name,
                "kind": t.kind,
                "shape": list(t.shape),
                "dtype": t.dtype,
                "bits": t.bits,
                "block_size": t.block_size,
                "blocks": t.blocks,
                "stored_bytes": t.stored_bytes,
                "float32_bytes": t.float32_bytes,
                "checksum": t.checksum,
            }
            for t in summary.tensors
        ],
    }


def format_summary(summary: CheckpointSummary) -> str:
    from models.reporting import format_table  # the project's one table printer

    rows = [
        [
            t.name,
            t.kind,
            "x".join(str(d) for d in t.shape),
            t.dtype,
            t.bits or "-",
            t.block_size or "-",
            t.blocks or "-",
            f"{t.stored_bytes:,}",
            f"{t.float32_bytes:,}",
            t.checksum,
        ]
        for t in summary.tensors
    ]
    stored = sum(t.stored_bytes for t in summary.tensors if t.kind != "bytes")
    as_float = sum(t.float32_bytes for t in summary.tensors)
    bad = [t for t in summary.tensors if t.checksum != "ok"]
    lines = [
        f"checkpoint {summary.path}: format version {summary.format_version}, "
        f"{summary.file_bytes:,} bytes",
        f"architecture: {_architecture_line(summary.architecture)}",
        "",
        format_table(
            [
                "tensor",
                "kind",
                "shape",
                "dtype",
                "bits",
                "block",
                "blocks",
                "stored",
                "as fp32",
                "checksum",
            ],
            rows,
        ),
        "",
        f"weights stored in {stored:,} bytes; {as_float:,} as float32"
        + (f" ({stored / as_float:.3f})" if as_float else ""),
        "checksums: all ok" if not bad else f"checksums: {len(bad)} tensor(s) damaged",
    ]
    return "\n".join(lines)


def _architecture_line(arch: Any) -> str:
    kind = arch.get("kind")
    if kind == "zoo":
        spec = arch.get("spec", {})
        inputs = ", ".join(f"{i.get('name')} {i.get('shape')}" for i in spec.get("inputs", []))
        return (
            f"zoo model {spec.get('name')!r}, {len(spec.get('layers', []))} layers, inputs {inputs}"
        )
    if kind == "onnx":
        return f"imported ONNX graph, {len(arch.get('rewrites', {}))} weights rewritten"
    return f"unknown kind {kind!r}"


def main(argv: Sequence[str]) -> int:
    """``argv`` starts with the sub-command: ``quantize ...`` or ``inspect ...``."""
    command, rest = (argv[0], argv[1:]) if argv else ("", [])
    if command == "quantize":
        return quantize_main(rest)
    if command == "inspect":
        return inspect_main(rest)
    print("usage: iotgw {quantize,inspect} ...", file=sys.stderr)
    return 2
