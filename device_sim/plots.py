"""PNG plots of a run's per-second timeline (from the summary document)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

# Agg: files only, no display; must be chosen before pyplot is imported.
matplotlib.use("Agg")
import matplotlib.pyplot as plt


def _phase_marks(ax: Any, summary: dict[str, Any]) -> None:
    for phase in summary["phases"][1:]:
        ax.axvline(phase["start_s"], color="grey", linestyle=":", linewidth=1)


def plot_latency(summary: dict[str, Any], path: Path) -> None:
    rows = summary["timeline"]
    t = [r["t"] for r in rows]
    fig, ax = plt.subplots(figsize=(9, 4))
    for key, label in (("p50_ms", "p50"), ("p95_ms", "p95"), ("p99_ms", "p99")):
        values = [r[key] if r[key] is not None else float("nan") for r in rows]
        ax.plot(t, values, marker=".", label=label)
    if summary["slo"] is not None:
        ax.axhline(summary["slo"]["slo_ms"], color="red", linestyle="--", label="SLO")
    _phase_marks(ax, summary)
    ax.set(
        xlabel="time since start (s), by send time",
        ylabel="latency (ms)",
        title="Latency at the device (successful replies)",
    )
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_rate(summary: dict[str, Any], path: Path) -> None:
    rows = summary["timeline"]
    t = [r["t"] for r in rows]
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.step(t, [r["offered_rps"] for r in rows], where="post", label="offered")
    ax.step(t, [r["achieved_rps"] for r in rows], where="post", label="achieved (200 replies)")
    _phase_marks(ax, summary)
    ax.set(xlabel="time since start (s)", ylabel="requests/s", title="Offered vs achieved rate")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_errors(summary: dict[str, Any], path: Path) -> None:
    rows = summary["timeline"]
    t = [r["t"] for r in rows]
    kinds = sorted({k for r in rows for k in r["errors"]})
    width = 0.9 * summary["timeline_bin_s"]
    fig, ax = plt.subplots(figsize=(9, 4))
    bottom = [0] * len(rows)
    for kind in kinds:
        counts = [r["errors"].get(kind, 0) for r in rows]
        ax.bar(t, counts, width=width, align="edge", bottom=bottom, label=kind)
        bottom = [b + c for b, c in zip(bottom, counts, strict=True)]
    lost = [r["lost"] for r in rows]
    ax.bar(
        t, lost, width=width, align="edge", bottom=bottom, label="lost (no reply)", color="black"
    )
    _phase_marks(ax, summary)
    ax.set(
        xlabel="time since start (s)",
        ylabel=f"requests per {summary['timeline_bin_s']:g} s",
        title="Errors by kind and lost requests",
    )
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_plots(summary: dict[str, Any], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "latency.png", out_dir / "rate.png", out_dir / "errors.png"]
    for plot, path in zip((plot_latency, plot_rate, plot_errors), paths, strict=True):
        plot(summary, path)
    return paths
