"""``iotgw bench http --quick`` runs the whole pipeline and writes a results file of the agreed
shape. No timing is asserted: benchmarks are not tests (see benchmarks.md)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from benchmarks.common import Repeated, format_table, percentiles, results_path
from tests.benchmarks.bench_process import run_bench

pytestmark = pytest.mark.slow

FIGURES = {
    "inprocess_limit_sweep",
    "gateway_knob_sweep",
    "gateway_saturation_sweep",
    "throughput_ratio",
    "low_load_latency",
    "cpu_per_request",
    "cpu_by_load",
}


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
    proc = run_bench("gateway.cli", "bench", "http", "--quick", "--out", str(out))
    files = sorted(p.name for p in out.iterdir())
    assert files == ["http.quick.json"], files
    return json.loads((out / "http.quick.json").read_text()), proc.stdout


def test_top_level_shape(quick_result: tuple[dict[str, Any], str]) -> None:
    doc, _ = quick_result
    assert doc["benchmark"] == "http"
    assert doc["quick"] is True
    assert isinstance(doc["created"], str) and "T" in doc["created"]
    machine = doc["machine"]
    assert isinstance(machine["cpu"], str) and machine["cpu"]
    assert isinstance(machine["cores"], int) and machine["cores"] >= 1
    assert machine["python"].startswith("3.")
    assert {"onnxruntime", "tensorflow", "aiohttp", "numpy"} <= set(machine["packages"])
    assert machine["packages"]["onnxruntime"]
    assert isinstance(doc["runs"], list) and doc["runs"]
    assert isinstance(doc["config"], dict) and "plan" in doc["config"]
    # The commit the figures come from (a clone of this checkout, or None outside git).
    assert doc["config"]["code"] is None or len(doc["config"]["code"]) >= 7


def test_summary(quick_result: tuple[dict[str, Any], str]) -> None:
    summary = quick_result[0]["summary"]
    for key in (
        "cnn_throughput_ratio",
        "p50_overhead_ms",
        "mlp_throughput_ratio",
        "p99_overhead_ms",
        "cnn_limit_rows_per_s",
        "cnn_gateway_rows_per_s",
        "mlp_limit_rows_per_s",
        "mlp_gateway_rows_per_s",
        "echo_p50_ms",
        "gateway_p50_ms",
        "mlp_runtime_batch1_p50_ms",
    ):
        assert isinstance(summary[key], int | float), key
        assert math.isfinite(summary[key]), key
    assert summary["cnn_throughput_ratio"] > 0
    assert summary["mlp_throughput_ratio"] > 0
    assert summary["cnn_gateway_rows_per_s"] > 0 and summary["cnn_limit_rows_per_s"] > 0
    for key in ("lost_requests_headline", "lost_requests_all_runs"):
        assert isinstance(summary[key], int) and summary[key] >= 0, key
    assert 0 <= summary["refused_requests_all_runs"] <= summary["lost_requests_all_runs"]
    # The gateway's CPU per request, json + asyncio against orjson + uvloop, as a ratio.
    for key in ("cpu_per_request_ratio", "cpu_per_request_us_before", "cpu_per_request_us_after"):
        assert isinstance(summary[key], float) and summary[key] > 0, key
    # CPU per request by load, over both transports, the trickle judged against saturation.
    for transport in ("http", "mqtt"):
        for level in ("trickle", "one_client", "saturation"):
            key = f"cpu_us_per_request_{level}_{transport}"
            assert isinstance(summary[key], float) and summary[key] > 0, key
        verdict = summary[f"trickle_vs_saturation_{transport}_target"]
        assert verdict in ("met", "missed") or verdict.startswith("unresolved"), verdict
    assert summary["idle_gateway_cores"] >= 0


def test_runs(quick_result: tuple[dict[str, Any], str]) -> None:
    runs = quick_result[0]["runs"]
    assert {r["figure"] for r in runs} == FIGURES
    for r in runs:
        if r["figure"] == "inprocess_limit_sweep":
            assert r["model"] in ("sensor_mlp", "vision_cnn")
            assert _is_repeated(r["rows_per_s"])
        elif r["figure"] in ("gateway_saturation_sweep", "gateway_knob_sweep"):
            for key in ("rows_per_s", "p50_ms", "p95_ms", "p99_ms"):
                assert _is_repeated(r[key]), key
            assert r["lost"] >= 0 and r["closed_loop_concurrency"] >= 1
    heads = [r for r in runs if r["figure"] == "throughput_ratio"]
    assert sorted(r["model"] for r in heads if r["headline"]) == ["sensor_mlp", "vision_cnn"]
    for r in heads:
        assert _is_repeated(r["limit"]["rows_per_s"])
        assert _is_repeated(r["gateway"]["rows_per_s"])
        assert _is_repeated(r["ratio_per_pair"])
        assert r["gateway"]["knobs"]["max_batch_size"] >= 1
        assert r["gateway"]["answered"] > 0
    lows = [r for r in runs if r["figure"] == "low_load_latency"]
    assert [r["client_kind"] for r in lows if r["headline"]] == ["aiohttp"]
    for low in lows:
        assert low["model"] == "sensor_mlp"
        assert low["gateway"]["knobs"]["batch_timeout_ms"] == 0
        for part in ("echo", "gateway"):
            assert _is_repeated(low[part]["p50_ms"]) and _is_repeated(low[part]["p99_ms"])
            assert low[part]["answered"] > 0
        assert _is_repeated(low["inprocess_runtime_batch1"]["p50_ms"])
        assert _is_repeated(low["p50_overhead_ms"])
    cpu = [r for r in runs if r["figure"] == "cpu_per_request"]
    assert [r["workload"] for r in cpu] == [
        "sensor_mlp_json",
        "sensor_mlp_binary",
        "vision_cnn_json",
    ]
    for r in cpu:
        assert _is_repeated(r["cpu_per_request_ratio"])
        for config in ("before", "after"):
            assert _is_repeated(r[config]["server_cpu_per_request_us"])
            assert r[config]["answered"] > 0 and r[config]["lost"] == 0
    (by_load,) = [r for r in runs if r["figure"] == "cpu_by_load"]
    assert by_load["model"] == "sensor_mlp" and by_load["lost"] == 0
    assert _is_repeated(by_load["idle_cores"])
    for transport in ("http", "mqtt"):
        for level in ("trickle", "one_client", "saturation"):
            assert _is_repeated(by_load["cpu_us_per_request"][transport][level]), level
            for run in by_load["runs"][transport][level]:
                assert run["answered"] > 0 and run["lost"] == 0, (transport, level)


def test_prints_a_table(quick_result: tuple[dict[str, Any], str]) -> None:
    stdout = quick_result[1]
    assert "Summary" in stdout and "cnn_throughput_ratio" in stdout
    assert "http.quick.json" in stdout


def test_common_helpers(tmp_path: Path) -> None:
    r = Repeated.of([3.0, 1.0, 2.0])
    assert (r.median, r.min, r.max, r.runs) == (2.0, 1.0, 3.0, 3)
    p = percentiles([1.0] * 99 + [100.0])
    assert p["p50"] == 1.0 and p["p99"] > 1.0
    assert math.isnan(percentiles([])["p50"])
    assert results_path("http", quick=True, out_dir=tmp_path) == tmp_path / "http.quick.json"
    assert results_path("http", quick=False, out_dir=tmp_path) == tmp_path / "http.json"
    table = format_table(["a", "b"], [["x", 1.5]])
    assert "1.500" in table
