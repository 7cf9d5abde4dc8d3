"""The train report's pages: ``train.md`` and its four PNG charts, drawn from a results file
(``train.json``) alone.

The pages are a function of the file: ``iotgw train --report`` writes the file and then draws
them from it, and ``iotgw train --report --from-results FILE`` draws them again from a file
without training (the full report trains for about half an hour), so committed pages always
show what the committed code makes of the committed figures.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

QUICK_CAVEAT = (
    "Quick mode: one seed, a few optimizer steps per run, so the accuracies are those of "
    "barely trained models (a check that every study runs), not the paper figures; "
    "`iotgw train --report` without --quick gives those (docs/training.md)."
)


@dataclass(frozen=True, slots=True)
class PageConfig:
    """What the pages read of a results file's ``config`` (the plan that ran)."""

    seeds: tuple[int, ...]
    bits: tuple[int, ...]
    target_accuracy: float
    """Validation accuracy the SimiGrad study counts steps to."""
    similarity_target: float
    """SimiGrad's target cosine between half-batch gradients."""

    @classmethod
    def of(cls, config: dict[str, Any]) -> PageConfig:
        return cls(
            seeds=tuple(config["seeds"]),
            bits=tuple(config["bits"]),
            target_accuracy=float(config["target_accuracy"]),
            similarity_target=float(config["simigrad"]["target"]),
        )


def load_results(path: Path) -> dict[str, Any]:
    """A train results document, or ValueError naming what is wrong with the file."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("benchmark") != "train":
        raise ValueError(f"{path}: not a train results file (its benchmark is not 'train')")
    missing = [
        k for k in ("created", "quick", "machine", "summary", "runs", "config") if k not in doc
    ]
    if missing:
        raise ValueError(f"{path}: a train results file without {', '.join(missing)}")
    return doc


def _mean(values: Sequence[float]) -> float:
    return float(statistics.fmean(values))


def _spread(values: Sequence[float]) -> dict[str, float]:
    return {
        "mean": _mean(values),
        "std": float(statistics.pstdev(values)) if len(values) > 1 else 0.0,
        "min": float(min(values)),
        "max": float(max(values)),
    }


def accuracy_table(plan: PageConfig, runs: list[dict[str, Any]]) -> str:
    rows = []
    fp32 = [r["test_accuracy"] for r in runs if r.get("mode") == "fp32"]
    rows.append(["fp32", "-", _fmt_spread(fp32), "-"])
    for bits in plan.bits:
        zpp = [r["test_accuracy"] for r in runs if r.get("mode") == "zero++" and r["bits"] == bits]
        ptq = [r["test_accuracy"] for r in runs if r.get("mode") == "ptq" and r["bits"] == bits]
        delta = 100 * (_mean(zpp) - _mean(fp32))
        rows.append([f"int{bits}", f"{delta:+.2f}", _fmt_spread(zpp), _fmt_spread(ptq)])
    return _markdown(["weights", "ZeRO++ - fp32 (points)", "ZeRO++ (no PTQ)", "fp32 + PTQ"], rows)


def simigrad_table(plan: PageConfig, runs: list[dict[str, Any]]) -> str:
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


CHARTS = ("accuracy_bits", "simigrad_batch", "simigrad_val", "traffic")
"""The charts' names after the results file's stem: ``train_accuracy_bits.png``, ..."""


def chart_names(stem: str) -> list[str]:
    return [f"{stem}_{chart}.png" for chart in CHARTS]


def plot(plan: PageConfig, runs: list[dict[str, Any]], out_dir: Path, stem: str) -> list[Path]:
    """The study's four charts as PNG files: accuracy against weight width, SimiGrad's batch
    size and validation accuracy per step, communication per step."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    figures = (
        _plot_accuracy_bits(plan, runs),
        _plot_simigrad_batch(plan, runs),
        _plot_simigrad_val(plan, runs),
        _plot_traffic(runs),
    )
    return [
        _save(fig, out_dir / name) for fig, name in zip(figures, chart_names(stem), strict=True)
    ]


def _plot_accuracy_bits(plan: PageConfig, runs: list[dict[str, Any]]) -> Any:
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


def _plot_simigrad_batch(plan: PageConfig, runs: list[dict[str, Any]]) -> Any:
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    seed = plan.seeds[0]
    for r in runs:
        if r["study"] != "simigrad" or r["seed"] != seed:
            continue
        top.plot(range(1, len(r["batch"]) + 1), r["batch"], label=r["mode"])
        if r["mode"] == "simigrad":
            bottom.plot(range(1, len(r["similarity"]) + 1), r["similarity"], label="similarity")
            bottom.axhline(plan.similarity_target, color="black", linestyle="--", label="target")
    top.set_ylabel("global batch")
    top.set_yscale("log", base=2)
    top.legend()
    top.set_title(f"Batch size per optimizer step (seed {seed})")
    bottom.set_xlabel("optimizer step")
    bottom.set_ylabel("cosine of half gradients")
    bottom.legend()
    return fig


def _plot_simigrad_val(plan: PageConfig, runs: list[dict[str, Any]]) -> Any:
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


def summary_rows(summary: dict[str, Any]) -> list[list[str]]:
    return [[key, f"{value:.4f}"] for key, value in summary.items()]


def provenance(doc: dict[str, Any], results_name: str) -> str:
    """Where the figures come from: the file, when and on what it ran, for how long."""
    machine = doc["machine"]
    seeds = len(doc["config"]["seeds"])
    minutes = doc["config"].get("seconds", 0) / 60
    return (
        f"Figures of `{results_name}`: {seeds} seed{'s' if seeds != 1 else ''}, run "
        f"{doc['created']} on {machine.get('cpu', 'an unknown CPU')} "
        f"({machine.get('cores', '?')} cores), {minutes:.0f} min of training. "
        "This page and its charts are drawn from that file alone; "
        f"`iotgw train --report --from-results {results_name}` draws them again without "
        "training."
    )


def markdown(doc: dict[str, Any], results_name: str) -> str:
    """The page of the results document ``doc``, read from the file ``results_name``."""
    plan = PageConfig.of(doc["config"])
    runs = doc["runs"]
    tables = {
        "Accuracy on the digits test split (%, mean +/- std over seeds)": accuracy_table(
            plan, runs
        ),
        "SimiGrad against fixed batches (ZeRO++ int8, same sample budget)": simigrad_table(
            plan, runs
        ),
        "Bytes per step (received, summed over ranks)": traffic_table(runs),
    }
    text = [f"# iotgw train report{' (quick)' if doc['quick'] else ''}", ""]
    if doc["quick"]:
        text += [QUICK_CAVEAT, ""]
    text += [provenance(doc, results_name), ""]
    text += ["## Summary", "", _markdown(["figure", "value"], summary_rows(doc["summary"])), ""]
    for title, table in tables.items():
        text += [f"## {title}", "", table, ""]
    text += ["## Plots", ""]
    charts = chart_names(results_name.removesuffix(".json"))
    text += [f"![{Path(name).stem}]({name})" for name in charts] + [""]
    return "\n".join(text)


def write_pages(results: Path) -> Path:
    """Draw ``<stem>.md`` and the ``<stem>_*.png`` charts next to a results file from it;
    returns the Markdown's path."""
    doc = load_results(results)
    try:
        plan = PageConfig.of(doc["config"])
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{results}: its config lacks {exc} (not written by iotgw train)") from exc
    stem = results.name.removesuffix(".json")
    plot(plan, doc["runs"], results.parent, stem)
    page = results.parent / f"{stem}.md"
    page.write_text(markdown(doc, results.name), encoding="utf-8")
    return page
