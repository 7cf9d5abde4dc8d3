"""PNG plots of a run's per-second timeline (from the summary document).

Every chart is titled with what was run (models, transport, offered rate), marks and names the
phases of a scenario, and says so in words when there is nothing to draw (an errors chart of a
run without errors), rather than drawing an empty axis.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

# Agg: files only, no display; must be chosen before pyplot is imported.
matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

_TRANSPORT_NAMES = {"mqtt5": "MQTT 5", "mqtt311": "MQTT 3.1.1", "http": "HTTP"}
# Phase labels sit at the top of the chart, every other one lower: the labels of short phases
# would otherwise run into each other.
_PHASE_LABEL_Y = (0.99, 0.91)
# The data keep to the lower part of a chart with phase labels; the labels take the top.
_DATA_HEIGHT = 0.82


def run_caption(summary: dict[str, Any]) -> str:
    """``sensor_mlp over MQTT 5, 100 req/s offered`` (what of it the summary knows)."""
    run = summary.get("run") or {}
    parts = []
    if run.get("models"):
        parts.append(", ".join(run["models"]))
    if run.get("transport"):
        parts.append(f"over {_TRANSPORT_NAMES.get(run['transport'], run['transport'])}")
    caption = " ".join(parts)
    offered = summary["offered_rps"]
    # 69.8, not 69.833; 1,250 rather than 1.25e+03
    rate = f"{offered:.3g} req/s offered" if offered < 1000 else f"{offered:,.0f} req/s offered"
    return f"{caption}, {rate}" if caption else rate


def phase_label(phase: dict[str, Any]) -> str:
    process = phase.get("process")
    if process is None or process == "trace":
        return str(phase["name"])
    return f"{phase['name']}: {process} {phase.get('mean_rate', 0):g}/s"


def _phase_marks(ax: Any, summary: dict[str, Any]) -> None:
    """A dotted line at each phase's start, labelled with the phase (several phases only)."""
    phases = summary["phases"]
    if len(phases) < 2:
        return
    # Room above the data for the labels: without it they sat on the highest points.
    bottom, top = ax.get_ylim()
    ax.set_ylim(bottom, bottom + (top - bottom) / _DATA_HEIGHT)
    for k, phase in enumerate(phases):
        if phase["start_s"] > 0:
            ax.axvline(phase["start_s"], color="grey", linestyle=":", linewidth=1)
        ax.text(
            phase["start_s"],
            _PHASE_LABEL_Y[k % len(_PHASE_LABEL_Y)],
            " " + phase_label(phase),
            transform=ax.get_xaxis_transform(),  # x in data, y in axes units: the top edge
            fontsize=8,
            color="dimgrey",
            va="top",
            ha="left",
        )


def _finish(fig: Figure, ax: Any, summary: dict[str, Any], what: str, xlabel: str) -> Figure:
    _phase_marks(ax, summary)
    ax.set(xlabel=xlabel, title=f"{what}\n{run_caption(summary)}")
    if ax.get_legend_handles_labels()[0]:
        # Outside the axes, on the right: inside, it covered the last seconds' points.
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def _per_model(summary: dict[str, Any]) -> list[tuple[str, list[dict[str, Any]]]]:
    """(model, timeline) for each model of a run of several, else nothing: a run of one
    model draws the whole run's lines as they are."""
    models = summary.get("models") or []
    if len(models) < 2:
        return []
    return [(m["name"], m["timeline"]) for m in models]


def _values(rows: list[dict[str, Any]], key: str) -> list[float]:
    return [r[key] if r[key] is not None else float("nan") for r in rows]


def latency_figure(summary: dict[str, Any]) -> Figure:
    rows = summary["timeline"]
    t = [r["t"] for r in rows]
    fig, ax = plt.subplots(figsize=(9, 4))
    per_model = _per_model(summary)
    if per_model:
        # One colour per model, p50 solid and p99 dashed (p95 left out: six lines for two
        # models already take a moment to read; summary.json has it).
        for k, (model, model_rows) in enumerate(per_model):
            colour = f"C{k % 10}"
            ax.plot(
                t, _values(model_rows, "p50_ms"), marker=".", color=colour, label=f"{model} p50"
            )
            ax.plot(
                t, _values(model_rows, "p99_ms"), linestyle="--", color=colour, label=f"{model} p99"
            )
    else:
        for key, label in (("p50_ms", "p50"), ("p95_ms", "p95"), ("p99_ms", "p99")):
            ax.plot(t, _values(rows, key), marker=".", label=label)
    if summary["slo"] is not None:
        ax.axhline(summary["slo"]["slo_ms"], color="red", linestyle="--", label="SLO")
    ax.set_ylabel("latency (ms)")
    return _finish(
        fig,
        ax,
        summary,
        "Latency at the device (successful replies)",
        "time since start (s), by send time",
    )


def _steps(ax: Any, edges: list[float], values: list[float], **style: Any) -> None:
    ax.step(edges, [*values, values[-1]], where="post", **style)


def rate_figure(summary: dict[str, Any]) -> Figure:
    rows = summary["timeline"]
    # Each bin drawn over its own span: the last one (which runs on to the last reply) ends
    # where the run ends instead of stopping at its start.
    edges = [r["t"] for r in rows] + [
        rows[-1]["t"] + rows[-1].get("span_s", summary["timeline_bin_s"])
    ]
    fig, ax = plt.subplots(figsize=(9, 4))
    # Offered wide and pale underneath: where the server keeps up, both lines stay visible.
    offered_style = {"linewidth": 4, "alpha": 0.4}
    per_model = _per_model(summary)
    if per_model:
        for k, (model, model_rows) in enumerate(per_model):
            colour = f"C{k % 10}"
            offered = [r["offered_rps"] for r in model_rows]
            achieved = [r["achieved_rps"] for r in model_rows]
            _steps(ax, edges, offered, color=colour, label=f"{model} offered", **offered_style)
            _steps(
                ax,
                edges,
                achieved,
                color=colour,
                linewidth=1.5,
                label=f"{model} achieved (status 200)",
            )
    else:
        _steps(ax, edges, [r["offered_rps"] for r in rows], label="offered", **offered_style)
        _steps(
            ax,
            edges,
            [r["achieved_rps"] for r in rows],
            linewidth=1.5,
            label="achieved (replies with status 200)",
        )
    ax.set_ylabel("requests/s")
    ax.set_ylim(bottom=0)
    return _finish(fig, ax, summary, "Offered vs achieved rate", "time since start (s)")


def errors_figure(summary: dict[str, Any]) -> Figure:
    rows = summary["timeline"]
    t = [r["t"] for r in rows]
    kinds = sorted({k for r in rows for k in r["errors"]})
    lost = [r["lost"] for r in rows]
    width = 0.9 * summary["timeline_bin_s"]
    fig, ax = plt.subplots(figsize=(9, 4))
    bottom = [0] * len(rows)
    for kind in kinds:
        counts = [r["errors"].get(kind, 0) for r in rows]
        ax.bar(t, counts, width=width, align="edge", bottom=bottom, label=kind)
        bottom = [b + c for b, c in zip(bottom, counts, strict=True)]
    if any(lost):
        ax.bar(
            t,
            lost,
            width=width,
            align="edge",
            bottom=bottom,
            label="lost (no reply)",
            color="black",
        )
    if not kinds and not any(lost):
        ax.text(
            0.5,
            0.5,
            "no errors, no lost requests",
            transform=ax.transAxes,
            ha="center",
            va="center",
            fontsize=14,
        )
        ax.set_ylim(0, 1)
        ax.set_yticks([])
        ax.set_xlim(0, rows[-1]["t"] + rows[-1].get("span_s", summary["timeline_bin_s"]))
    ax.set_ylabel(f"requests per {summary['timeline_bin_s']:g} s")
    return _finish(fig, ax, summary, "Errors by kind and lost requests", "time since start (s)")


def write_plots(summary: dict[str, Any], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "latency.png", out_dir / "rate.png", out_dir / "errors.png"]
    for draw, path in zip((latency_figure, rate_figure, errors_figure), paths, strict=True):
        fig = draw(summary)
        fig.savefig(path, dpi=100)
        plt.close(fig)
    return paths
