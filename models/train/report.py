"""``iotgw train --report``: the reproduction report of ZeRO++ and SimiGrad on digits.

Three studies, every accuracy on the fixed digits test split (360 images, so one image is 0.28
points), every figure a mean over seeds with its spread:

1. accuracy against weight width: fp32 training; ZeRO++-style training (qwZ at 8/6/4/2 bits +
   qgZ int4) served at that width from its own codes; round-to-nearest PTQ of the fp32 model
   at the same widths (same quantizer, same blocks);
2. SimiGrad against a small and a large fixed batch, same sample budget (ZeRO++ int8): final
   accuracy, optimizer steps until the validation accuracy first reaches ``target_accuracy``,
   mean batch, and the batch-size trajectory;
3. bytes per step, ZeRO-3 against ZeRO++, for the model trained.

Writes ``train.json`` (``train.quick.json`` in quick mode; shape of
``/work/shared/benchmarks.md``), then draws ``train.md`` and PNG plots next to it from that file
(``report_pages``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from models.machine import machine_info
from models.reporting import format_table, write_results
from models.train.export import ptq_weights
from models.train.report_pages import QUICK_CAVEAT, summary_rows, write_pages
from models.train.simigrad import SimiGradConfig
from models.train.trainer import TrainConfig, Trainer

PACKAGES = {"tensorflow": ["tensorflow-cpu", "tensorflow"], "keras": ["keras"], "numpy": ["numpy"]}


@dataclass(frozen=True, slots=True)
class ReportPlan:
    seeds: tuple[int, ...] = (0, 1, 2)
    bits: tuple[int, ...] = (8, 6, 4, 2)
    epochs: float = 20.0
    micro_batch: int = 8
    """Per-worker batch of the accuracy study (global 64 on 2 x 4 workers)."""
    small_micro_batch: int = 4
    large_micro_batch: int = 32
    simigrad: SimiGradConfig = field(
        default_factory=lambda: SimiGradConfig(target=0.5, min_micro_batch=4, max_micro_batch=64)
    )
    target_accuracy: float = 0.95
    eval_every: int = 2
    max_steps: int | None = None


FULL = ReportPlan()
# Seconds, for CI: one seed, a fraction of an epoch per run.
QUICK = ReportPlan(
    seeds=(0,), bits=(8, 4, 2), epochs=0.3, eval_every=1, target_accuracy=0.3, max_steps=6
)


def _train(config: TrainConfig, progress: bool) -> Trainer:
    trainer = Trainer(config)
    trainer.run(progress=progress)
    return trainer


def _mean(values: Sequence[float]) -> float:
    return float(statistics.fmean(values))


def accuracy_study(plan: ReportPlan, progress: bool) -> list[dict[str, Any]]:
    runs = []
    base = TrainConfig(
        epochs=plan.epochs,
        micro_batch=plan.micro_batch,
        eval_every=0,
        max_steps=plan.max_steps,
    )
    for seed in plan.seeds:
        started = time.perf_counter()
        fp32 = _train(replace(base, bits=None, qgz=False, seed=seed), progress)
        weights = fp32.served_weights()
        runs.append(
            {
                "study": "accuracy",
                "mode": "fp32",
                "bits": None,
                "seed": seed,
                "test_accuracy": fp32.accuracy(weights, "test"),
                "steps": fp32.step,
                "seconds": time.perf_counter() - started,
            }
        )
        for bits in plan.bits:
            ptq = ptq_weights(fp32.spec, weights, bits, base.block_size)
            runs.append(
                {
                    "study": "accuracy",
                    "mode": "ptq",
                    "bits": bits,
                    "seed": seed,
                    "test_accuracy": fp32.accuracy(ptq, "test"),
                }
            )
        for bits in plan.bits:
            started = time.perf_counter()
            zpp = _train(replace(base, bits=bits, qgz=True, seed=seed), progress)
            runs.append(
                {
                    "study": "accuracy",
                    "mode": "zero++",
                    "bits": bits,
                    "seed": seed,
                    "test_accuracy": zpp.accuracy(zpp.served_weights(), "test"),
                    "steps": zpp.step,
                    "seconds": time.perf_counter() - started,
                }
            )
    return runs


def simigrad_study(plan: ReportPlan, progress: bool) -> list[dict[str, Any]]:
    runs = []
    base = TrainConfig(
        bits=8, epochs=plan.epochs, eval_every=plan.eval_every, max_steps=plan.max_steps
    )
    modes = {
        "fixed_small": replace(base, micro_batch=plan.small_micro_batch),
        "fixed_large": replace(base, micro_batch=plan.large_micro_batch),
        "simigrad": replace(base, micro_batch=plan.small_micro_batch, simigrad=plan.simigrad),
    }
    for seed in plan.seeds:
        for mode, config in modes.items():
            started = time.perf_counter()
            trainer = _train(replace(config, seed=seed), progress)
            history = trainer.history
            runs.append(
                {
                    "study": "simigrad",
                    "mode": mode,
                    "seed": seed,
                    "test_accuracy": trainer.accuracy(trainer.served_weights(), "test"),
                    "steps": trainer.step,
                    "samples": trainer.samples,
                    "mean_batch": history.mean_batch(),
                    "steps_to_target": history.steps_to(plan.target_accuracy),
                    "batch": [s.batch for s in history.steps],
                    "similarity": [s.similarity for s in history.steps],
                    "lr": [s.lr for s in history.steps],
                    "val": [[e.step, e.val_accuracy] for e in history.evals],
                    "seconds": time.perf_counter() - started,
                }
            )
    return runs


def traffic_study(plan: ReportPlan) -> list[dict[str, Any]]:
    runs = []
    for bits in plan.bits:
        trainer = Trainer(TrainConfig(bits=bits))
        zero3, zeropp = trainer.traffic()
        runs.append(
            {
                "study": "traffic",
                "bits": bits,
                "nodes": trainer.config.nodes,
                "per_node": trainer.config.per_node,
                "schemes": [
                    {
                        "scheme": t.scheme,
                        "intra_bytes": t.intra_bytes,
                        "inter_bytes": t.inter_bytes,
                        "total_bytes": t.total_bytes,
                        "collectives": [
                            {**asdict(c), "total_bytes": c.total_bytes} for c in t.collectives
                        ],
                    }
                    for t in (zero3, zeropp)
                ],
                "inter_ratio": zeropp.inter_bytes / zero3.inter_bytes,
                "total_ratio": zeropp.total_bytes / zero3.total_bytes,
            }
        )
    return runs


def summarize(plan: ReportPlan, runs: list[dict[str, Any]]) -> dict[str, Any]:
    def acc(study: str, mode: str, bits: int | None = None) -> list[float]:
        return [
            r["test_accuracy"]
            for r in runs
            if r["study"] == study and r["mode"] == mode and r.get("bits") == bits
        ]

    def simi(mode: str, key: str) -> list[float]:
        return [r[key] for r in runs if r["study"] == "simigrad" and r["mode"] == mode]

    traffic8 = next(r for r in runs if r["study"] == "traffic" and r["bits"] == 8)
    small_batch = _mean(simi("fixed_small", "mean_batch"))
    summary: dict[str, Any] = {
        "acc_fp32": _mean(acc("accuracy", "fp32")),
        "acc_int8": _mean(acc("accuracy", "zero++", 8)),
        "acc_int4": _mean(acc("accuracy", "zero++", 4)),
        "acc_int2": _mean(acc("accuracy", "zero++", 2)),
        "acc_ptq_int4": _mean(acc("accuracy", "ptq", 4)),
        "acc_ptq_int2": _mean(acc("accuracy", "ptq", 2)),
        "simigrad_acc": _mean(simi("simigrad", "test_accuracy")),
        "fixed_small_acc": _mean(simi("fixed_small", "test_accuracy")),
        "simigrad_mean_batch_ratio": _mean(simi("simigrad", "mean_batch")) / small_batch,
        "traffic_ratio": traffic8["inter_ratio"],
    }
    summary["traffic_ratio_all_links"] = traffic8["total_ratio"]
    if 6 in plan.bits:
        summary["acc_int6"] = _mean(acc("accuracy", "zero++", 6))
    summary["fixed_large_acc"] = _mean(simi("fixed_large", "test_accuracy"))
    return summary


def run_report(*, quick: bool, out_dir: Path | None = None, progress: bool = False) -> Path:
    """Run the three studies, write the JSON and draw the Markdown and plots from it; returns
    the JSON's path."""
    plan = QUICK if quick else FULL
    machine = machine_info(PACKAGES)
    started = time.perf_counter()
    runs = accuracy_study(plan, progress) + simigrad_study(plan, progress) + traffic_study(plan)
    summary = summarize(plan, runs)
    config = asdict(plan)
    config["seconds"] = time.perf_counter() - started
    config["train_defaults"] = TrainConfig().to_doc()
    path = write_results(
        "train",
        quick=quick,
        out_dir=out_dir,
        machine=machine,
        summary=summary,
        runs=runs,
        config=config,
    )
    write_pages(path)
    print(format_table(["summary", "value"], summary_rows(summary)))
    if quick:
        print(QUICK_CAVEAT)
    return path
