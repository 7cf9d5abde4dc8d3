"""``iotgw bench quant --quick`` runs the whole pipeline and writes a results file of the agreed
shape. No timing or memory figure is asserted: benchmarks are not tests (see benchmarks.md)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from tests.benchmarks.bench_process import run_bench

pytestmark = pytest.mark.slow


def _is_repeated(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and {"median", "min", "max", "runs", "values"} <= set(value)
        and value["runs"] == len(value["values"]) >= 1
        and value["min"] <= value["median"] <= value["max"]
    )


@pytest.fixture(scope="module")
def quick_result(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    out = tmp_path_factory.mktemp("bench")
    proc = run_bench("gateway.cli", "bench", "quant", "--quick", "--out", str(out))
    assert sorted(p.name for p in out.iterdir()) == ["quant.quick.json"]
    return json.loads((out / "quant.quick.json").read_text()), proc.stdout


def test_shape_and_summary(quick_result: tuple[dict[str, Any], str]) -> None:
    doc, stdout = quick_result
    assert (doc["benchmark"], doc["quick"]) == ("quant", True)
    assert doc["machine"]["cores"] >= 1 and doc["machine"]["packages"]["onnxruntime"]
    summary = doc["summary"]
    for key in ("int4_weight_memory_ratio", "int4_batch1_latency_ratio"):
        assert isinstance(summary[key], float) and math.isfinite(summary[key]) and summary[key] > 0
    for suffix in ("_tf", "_cnn", "_cnn_tf"):
        assert summary[f"int4_weight_memory_ratio{suffix}"] > 0
        for batch in (1, 8, 32):
            assert summary[f"int8_batch{batch}_latency_ratio{suffix}"] > 0
    # The CNN's int4 at its worst batch size, with that ratio's spread over the rounds.
    worst = summary["int4_worst_latency_ratio_cnn"]
    batch = summary["int4_worst_latency_batch_cnn"]
    assert worst == max(summary[f"int4_batch{b}_latency_ratio_cnn"] for b in (1, 8, 32))
    assert worst == summary[f"int4_batch{batch}_latency_ratio_cnn"]
    low, high = summary["int4_worst_latency_spread_cnn"]
    assert low <= worst <= high
    assert summary["int4_worst_latency_target_met_cnn"] == (worst <= 1.0)
    assert doc["config"]["block_size"] == 128 and "RssAnon" in doc["config"]["memory_method"]
    assert "Summary" in stdout and "int4_weight_memory_ratio" in stdout
    assert "quant.quick.json" in stdout


def test_every_configuration_is_measured(quick_result: tuple[dict[str, Any], str]) -> None:
    runs = quick_result[0]["runs"]
    combos = {(r["model"], r["runtime"], r["precision"]) for r in runs}
    assert len(combos) == len(runs) == 12  # 2 models x 2 runtimes x fp32/int8/int4
    for r in runs:
        assert _is_repeated(r["memory"]["held_bytes"]) and _is_repeated(r["memory"]["load_bytes"])
        assert r["file_bytes"] > 0 and r["tensor_bytes"] > 0
        for batch in ("1", "8", "32"):
            assert _is_repeated(r["latency_s"][batch])
            assert _is_repeated(r["latency_ratio_vs_fp32"][batch])
        agreement = r["agreement"]
        assert 0 <= agreement["argmax_agreement_vs_fp32"] <= 1
        assert agreement["max_abs_diff_vs_numpy_reference"] < 0.1  # computes what the codes say
        if r["precision"] == "fp32":
            assert agreement["max_abs_diff_vs_fp32"] == 0.0
            assert r["weight_memory_ratio_vs_fp32"] == 1.0
        else:
            assert r["file_bytes"] < 0.5 * _fp32(runs, r)["file_bytes"]


def _fp32(runs: list[dict[str, Any]], row: dict[str, Any]) -> dict[str, Any]:
    return next(
        r
        for r in runs
        if (r["model"], r["runtime"], r["precision"]) == (row["model"], row["runtime"], "fp32")
    )
