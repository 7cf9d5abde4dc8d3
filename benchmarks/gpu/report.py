"""The GPU benchmark's summary: each side's headline figures, and the cuda / cpu ratios."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# (summary key here, benchmark, its summary key): each side's figure, suffixed _cuda / _cpu.
SIDE_FIGURES: tuple[tuple[str, str, str], ...] = (
    ("cnn_gateway_rows_per_s", "http", "cnn_gateway_rows_per_s"),
    ("cnn_limit_rows_per_s", "http", "cnn_limit_rows_per_s"),
    ("cnn_throughput_ratio", "http", "cnn_throughput_ratio"),
    ("gateway_p50_ms", "http", "gateway_p50_ms"),
    ("p50_overhead_ms", "http", "p50_overhead_ms"),
    ("lost_requests_headline", "http", "lost_requests_headline"),
    ("fc_fp32_batch1_ms", "quant", "fc_fp32_batch1_ms"),
    ("int4_batch1_latency_ratio", "quant", "int4_batch1_latency_ratio"),
    ("int4_batch1_latency_ratio_tf", "quant", "int4_batch1_latency_ratio_tf"),
)
# (summary key, the side figure whose cuda / cpu ratio it is).
RATIOS: tuple[tuple[str, str], ...] = (
    ("cnn_gateway_throughput_cuda_vs_cpu", "cnn_gateway_rows_per_s"),
    ("cnn_limit_throughput_cuda_vs_cpu", "cnn_limit_rows_per_s"),
    ("gateway_p50_ms_cuda_vs_cpu", "gateway_p50_ms"),
    ("fc_fp32_batch1_latency_cuda_vs_cpu", "fc_fp32_batch1_ms"),
)


def _ratio(cuda: object, cpu: object) -> float | None:
    if not isinstance(cuda, int | float) or not isinstance(cpu, int | float) or cpu == 0:
        return None
    return round(cuda / cpu, 4)


def fc_int4_batch1_ms(quant_summary: Mapping[str, Any]) -> float | None:
    """The fully connected model's int4 batch-1 latency on ONNX Runtime (fp32 x int4 / fp32)."""
    fp32 = quant_summary.get("fc_fp32_batch1_ms")
    ratio = quant_summary.get("int4_batch1_latency_ratio")
    if not isinstance(fp32, int | float) or not isinstance(ratio, int | float):
        return None
    return round(fp32 * ratio, 4)


def summarize(sides: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """``sides``: side -> its entry (``{"http": {"summary": ...}, "quant": {...}}``)."""
    per_side: dict[str, dict[str, Any]] = {}
    for side, entry in sides.items():
        figures = {key: entry[bench]["summary"].get(source) for key, bench, source in SIDE_FIGURES}
        figures["fc_int4_batch1_ms"] = fc_int4_batch1_ms(entry["quant"]["summary"])
        per_side[side] = figures
    cuda, cpu = per_side["cuda"], per_side["cpu"]
    summary: dict[str, Any] = {key: _ratio(cuda[fig], cpu[fig]) for key, fig in RATIOS}
    summary["fc_int4_batch1_latency_cuda_vs_cpu"] = _ratio(
        cuda["fc_int4_batch1_ms"], cpu["fc_int4_batch1_ms"]
    )
    for side, figures in per_side.items():
        summary.update({f"{key}_{side}": value for key, value in figures.items()})
    return summary
