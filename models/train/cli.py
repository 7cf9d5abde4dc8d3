"""``iotgw train``: train the digits CNN ZeRO++-style and export its checkpoint, or run the
reproduction report (``--report``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from models.quant import SUPPORTED_BITS

if TYPE_CHECKING:
    from models.train.trainer import Trainer


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="iotgw train",
        description="Train the digits CNN with ZeRO++ numerics (qwZ weights, qgZ int4 "
        "gradients over simulated workers, hpZ in the traffic figures) and optional SimiGrad "
        "adaptive batching; export the checkpoint the gateway serves with no PTQ.",
    )
    p.add_argument("--report", action="store_true", help="run the reproduction report instead")
    p.add_argument("--quick", action="store_true", help="with --report: seconds, for CI")
    p.add_argument(
        "--results-dir", type=Path, help="with --report: where results go (benchmarks/results)"
    )
    p.add_argument(
        "--from-results",
        type=Path,
        metavar="TRAIN.json",
        help="with --report: train nothing, draw the Markdown and charts next to this results "
        "file again from its figures (seconds; the full report trains for about 30 min)",
    )
    p.add_argument("--out", type=Path, help="write the trained checkpoint (.safetensors) here")
    p.add_argument(
        "--serve-dir",
        type=Path,
        metavar="REPO/MODEL/VERSION",
        help="write a ready-to-serve model version here (model.safetensors and config.toml); "
        "serve it with: iotgw serve --model-repo REPO",
    )
    p.add_argument(
        "--runtime",
        choices=["onnxruntime", "tensorflow"],
        default="onnxruntime",
        help="with --serve-dir: the runtime config.toml names (default onnxruntime)",
    )
    p.add_argument(
        "--bits",
        default="8",
        choices=["none", *(str(b) for b in SUPPORTED_BITS)],
        help="qwZ weight bits; none trains fp32 (default 8)",
    )
    p.add_argument("--block-size", type=int, default=32, help="qwZ block size (default 32)")
    p.add_argument("--nodes", type=int, default=2, help="simulated nodes (default 2)")
    p.add_argument("--per-node", type=int, default=4, help="workers per node (default 4)")
    p.add_argument("--no-qgz", action="store_true", help="average gradients in float32")
    p.add_argument("--error-feedback", action="store_true", help="qgZ error feedback")
    p.add_argument("--micro-batch", type=int, default=8, help="per-worker batch (default 8)")
    p.add_argument("--simigrad", action="store_true", help="adapt the batch size (SimiGrad)")
    p.add_argument("--target-similarity", type=float, default=0.5, help="SimiGrad target")
    p.add_argument("--min-micro-batch", type=int, default=2, help="SimiGrad lower bound")
    p.add_argument("--max-micro-batch", type=int, default=64, help="SimiGrad upper bound")
    p.add_argument("--epochs", type=float, default=30.0, help="sample budget in epochs")
    p.add_argument("--max-steps", type=int, help="stop after this many optimizer steps")
    p.add_argument("--lr", type=float, default=2e-3, help="learning rate at the first batch")
    p.add_argument("--optimizer", choices=["adam", "sgd"], default="adam")
    p.add_argument("--seed", type=int, default=0, help="weights and data order")
    p.add_argument("--state", type=Path, help="save the training state to this folder")
    p.add_argument("--resume", action="store_true", help="continue from --state")
    p.add_argument("--log", type=Path, help="append one JSON line per step to this file")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _trainer(args: argparse.Namespace) -> Trainer:
    """A new trainer from the options, or the one saved in --state (--resume)."""
    from models.train.simigrad import SimiGradConfig
    from models.train.trainer import TrainConfig, Trainer

    if args.resume:
        if args.state is None:
            raise ValueError("--resume needs --state")
        return Trainer.resume(args.state, epochs=args.epochs, max_steps=args.max_steps)
    simigrad = (
        SimiGradConfig(args.target_similarity, args.min_micro_batch, args.max_micro_batch)
        if args.simigrad
        else None
    )
    config = TrainConfig(
        bits=None if args.bits == "none" else int(args.bits),
        block_size=args.block_size,
        nodes=args.nodes,
        per_node=args.per_node,
        qgz=not args.no_qgz,
        error_feedback=args.error_feedback,
        micro_batch=args.micro_batch,
        simigrad=simigrad,
        epochs=args.epochs,
        max_steps=args.max_steps,
        lr=args.lr,
        optimizer=args.optimizer,
        seed=args.seed,
    )
    return Trainer(config)


def _print_figures(trainer: Trainer) -> None:
    served = trainer.served_weights()
    print(
        f"steps {trainer.step}, samples {trainer.samples}, mean batch "
        f"{trainer.history.mean_batch():.1f}; accuracy val "
        f"{trainer.accuracy(served, 'val'):.4f} test {trainer.accuracy(served, 'test'):.4f}"
    )
    zero3, zeropp = trainer.traffic()
    for where, a, b in (
        ("across nodes", zero3.inter_bytes, zeropp.inter_bytes),
        ("on all links", zero3.total_bytes, zeropp.total_bytes),
    ):
        ratio = f" (ratio {b / a:.3f})" if a else ""
        print(f"bytes per step {where}: ZeRO-3 {a:,}, ZeRO++ {b:,}{ratio}")


def _save(args: argparse.Namespace, trainer: Trainer) -> None:
    from models.train.export import export_checkpoint, export_serving_folder

    if args.state is not None:
        trainer.save_state(args.state)
        print(f"saved state to {args.state}")
    if args.out is not None:
        export_checkpoint(trainer, args.out)
        print(f"wrote {args.out}")
    if args.serve_dir is not None:
        config = export_serving_folder(trainer, args.serve_dir, runtime=args.runtime)
        print(f"wrote {args.serve_dir} (model.safetensors, {config.name})")
        print(f"serve it: iotgw serve --model-repo {args.serve_dir.parent.parent}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    # Deferred: TensorFlow takes seconds to import; --help should not.
    if args.from_results is not None and not args.report:
        print("iotgw train: --from-results goes with --report", file=sys.stderr)
        return 2
    if args.report and args.from_results is not None:
        from models.train.report_pages import write_pages

        try:
            page = write_pages(args.from_results)
        except (OSError, ValueError) as exc:
            print(f"iotgw train --report: {exc}", file=sys.stderr)
            return 2
        print(f"wrote {page} and its charts, from {args.from_results}")
        return 0
    if args.report:
        from models.train.report import run_report

        path = run_report(quick=args.quick, out_dir=args.results_dir)
        print(f"wrote {path}")
        return 0
    from models.train.export import check_version_dir

    try:
        if args.serve_dir is not None:
            check_version_dir(args.serve_dir)  # before training, not after
        trainer = _trainer(args)
    except ValueError as exc:
        print(f"iotgw train: {exc}", file=sys.stderr)
        return 2
    trainer.run(progress=not args.no_progress, log_path=args.log)
    _print_figures(trainer)
    _save(args, trainer)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
