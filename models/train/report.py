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
``/work/shared/benchmarks.md``), ``train.md`` and PNG plots next to it.
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


QUICK_CAVEAT = (
    "Quick mode: one seed, a few optimizer steps per run, so the accuracies are those of "
    "barely trained models (a check that every study runs), not the paper figures; "
    "`iotgw train --report` without --quick gives those (docs/training.md)."
)


def _train(config: TrainConfig, progress: bool) -> Trainer:
    trainer = Trainer(config)
    trainer.run(progress=progress)
    return trainer


def _mean(values: Sequence[float]) -> float:
    return float(statistics.fmean(values))


def _spread(values: Sequence[float]) -> dict[str, float]:
    return {
        "mean": _mean(values),
        "std": float(statistics.pstdev(values)) if len(values) > 1 else 0.0,
        "min": float(min(values)),
        "max": float(max(values)),
    }


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


def accuracy_table(plan: ReportPlan, runs: list[dict[str, Any]]) -> str:
    rows = []
    fp32 = [r["test_accuracy"] for r in runs if r.get("mode") == "fp32"]
    rows.append(["fp32", "-", _fmt_spread(fp32), "-"])
    for bits in plan.bits:
        zpp = [r["test_accuracy"] for r in runs if r.get("mode") == "zero++" and r["bits"] == bits]
        ptq = [r["test_accuracy"] for r in runs if r.get("mode") == "ptq" and r["bits"] == bits]
        delta = 100 * (_mean(zpp) - _mean(fp32))
        rows.append([f"int{bits}", f"{delta:+.2f}", _fmt_spread(zpp), _fmt_spread(ptq)])
    return _markdown(["weights", "ZeRO++ - fp32 (points)", "ZeRO++ (no PTQ)", "fp32 + PTQ"], rows)


def simigrad_table(plan: ReportPlan, runs: list[dict[str, Any]]) -> str:
    rows = []
    for mode in ("fixed_small", "fixed_large", "simigrad"):
        mine = [r for r in runs if r["study"] == "simigrad" and r["mode"] == mode]
        reached = [r["steps_to_target"] for r in mine if r["steps_to_target"] is not None]
        rows.append(
            [
                mode,
                _fmt_spread([r["test_accuracy"] for r in mine]),
                f"{_mean([r['mean_batch'] for r in mine]):.1f}",
                f"{_mean([r['steps'] for r in mine]):.0f}",
                f"{_mean(reached):.0f} ({len(reached)}/{len(mine)} runs)" if reached else "never",
            ]
        )
    headers = ["batch", "test accuracy", "mean batch", "optimizer steps"]
    headers.append(f"steps to val acc {plan.target_accuracy:.2f}")
    return _markdown(headers, rows)


def traffic_table(runs: list[dict[str, Any]]) -> str:
    rows = []
    for r in runs:
        if r["study"] != "traffic":
            continue
        zero3, zeropp = r["schemes"]
        rows.append(
            [
                f"int{r['bits']}",
                f"{zero3['inter_bytes']:,}",
                f"{zeropp['inter_bytes']:,}",
                f"{r['inter_ratio']:.3f}",
                f"{zero3['total_bytes']:,}",
                f"{zeropp['total_bytes']:,}",
                f"{r['total_ratio']:.3f}",
            ]
        )
    headers = ["qwZ", "ZeRO-3 inter-node B", "ZeRO++ inter-node B", "ratio"]
    headers += ["ZeRO-3 all links B", "ZeRO++ all links B", "ratio"]
    return _markdown(headers, rows)


def _fmt_spread(values: Sequence[float]) -> str:
    s = _spread(values)
    return f"{100 * s['mean']:.2f} +/- {100 * s['std']:.2f} (n={len(values)})"


def _markdown(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def plot(plan: ReportPlan, runs: list[dict[str, Any]], out_dir: Path, stem: str) -> list[Path]:
    """The study's four charts as PNG files: accuracy against weight width, SimiGrad's batch
    size and validation accuracy per step, communication per step."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    return [
        _save(_plot_accuracy_bits(plan, runs), out_dir / f"{stem}_accuracy_bits.png"),
        _save(_plot_simigrad_batch(plan, runs), out_dir / f"{stem}_simigrad_batch.png"),
        _save(_plot_simigrad_val(plan, runs), out_dir / f"{stem}_simigrad_val.png"),
        _save(_plot_traffic(runs), out_dir / f"{stem}_traffic.png"),
    ]


def _plot_accuracy_bits(plan: ReportPlan, runs: list[dict[str, Any]]) -> Any:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    fp32 = [r["test_accuracy"] for r in runs if r.get("mode") == "fp32"]
    ax.axhline(100 * _mean(fp32), color="black", linestyle="--", label="fp32")
    for mode, label in (("zero++", "ZeRO++ (qwZ+qgZ), served as trained"), ("ptq", "fp32 + PTQ")):
        means, stds = [], []
        for bits in plan.bits:
            v = [r["test_accuracy"] for r in runs if r.get("mode") == mode and r["bits"] == bits]
            means.append(100 * _mean(v))
            stds.append(100 * _spread(v)["std"])
        ax.errorbar(plan.bits, means, yerr=stds, marker="o", capsize=4, label=label)
    ax.set_xlabel("weight bits")
    ax.set_ylabel("digits test accuracy (%)")
    ax.set_xticks(list(plan.bits))
    ax.invert_xaxis()
    ax.legend()
    ax.set_title(f"Accuracy vs weight width ({len(plan.seeds)} seeds, mean +/- std)")
    return fig


def _plot_simigrad_batch(plan: ReportPlan, runs: list[dict[str, Any]]) -> Any:
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    seed = plan.seeds[0]
    for r in runs:
        if r["study"] != "simigrad" or r["seed"] != seed:
            continue
        top.plot(range(1, len(r["batch"]) + 1), r["batch"], label=r["mode"])
        if r["mode"] == "simigrad":
            bottom.plot(range(1, len(r["similarity"]) + 1), r["similarity"], label="similarity")
            bottom.axhline(plan.simigrad.target, color="black", linestyle="--", label="target")
    top.set_ylabel("global batch")
    top.set_yscale("log", base=2)
    top.legend()
    top.set_title(f"Batch size per optimizer step (seed {seed})")
    bottom.set_xlabel("optimizer step")
    bottom.set_ylabel("cosine of half gradients")
    bottom.legend()
    return fig


def _plot_simigrad_val(plan: ReportPlan, runs: list[dict[str, Any]]) -> Any:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    seed = plan.seeds[0]
    for r in runs:
        if r["study"] == "simigrad" and r["seed"] == seed and r["val"]:
            steps, acc = zip(*r["val"], strict=True)
            ax.plot(steps, [100 * a for a in acc], label=r["mode"])
    ax.axhline(100 * plan.target_accuracy, color="black", linestyle=":", label="target")
    ax.set_xscale("log")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("validation accuracy (%)")
    ax.legend()
    ax.set_title(f"Validation accuracy per step (seed {seed})")
    return fig


def _plot_traffic(runs: list[dict[str, Any]]) -> Any:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    traffic8 = next(r for r in runs if r["study"] == "traffic" and r["bits"] == 8)
    for x, scheme in enumerate(traffic8["schemes"]):
        ax.bar(x, scheme["inter_bytes"] / 1e3, label="across nodes" if x == 0 else None, color="C3")
        ax.bar(
            x,
            scheme["intra_bytes"] / 1e3,
            bottom=scheme["inter_bytes"] / 1e3,
            label="inside nodes" if x == 0 else None,
            color="C0",
        )
    ax.set_xticks([0, 1], [s["scheme"] for s in traffic8["schemes"]], fontsize=8)
    ax.set_ylabel("kB received per step, all ranks")
    ax.legend()
    ax.set_title(f"Communication per step ({traffic8['nodes']} nodes x {traffic8['per_node']})")
    return fig


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def run_report(*, quick: bool, out_dir: Path | None = None, progress: bool = False) -> Path:
    """Run the three studies and write JSON, Markdown and plots; returns the JSON's path."""
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
    stem = path.name.removesuffix(".json")
    tables = {
        "Accuracy on the digits test split (%, mean +/- std over seeds)": accuracy_table(
            plan, runs
        ),
        "SimiGrad against fixed batches (ZeRO++ int8, same sample budget)": simigrad_table(
            plan, runs
        ),
        "Bytes per step (received, summed over ranks)": traffic_table(runs),
    }
    plots = plot(plan, runs, path.parent, stem)
    text = [f"# iotgw train report{' (quick)' if quick else ''}", ""]
    if quick:
        text += [QUICK_CAVEAT, ""]
    text += ["## Summary", "", _markdown(["figure", "value"], _summary_rows(summary)), ""]
    for title, table in tables.items():
        text += [f"## {title}", "", table, ""]
    text += ["## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots] + [""]
    (path.parent / f"{stem}.md").write_text("\n".join(text), encoding="utf-8")
    print(format_table(["summary", "value"], _summary_rows(summary)))
    if quick:
        print(QUICK_CAVEAT)
    return path


def _summary_rows(summary: dict[str, Any]) -> list[list[str]]:
    return [[key, f"{value:.4f}"] for key, value in summary.items()]
