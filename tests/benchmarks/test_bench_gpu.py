"""``iotgw bench gpu`` on a machine without a GPU: it finds, by opening the models, that the
cuda side would run on the CPU, and stops with the reason before measuring anything; its cpu
side's check passes. Its summary, read from real results files. (The run itself needs a GPU:
./scripts/test.sh --gpu.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import onnxruntime as ort
import pytest

from benchmarks.gpu.report import summarize
from benchmarks.gpu.run import PROBE_MODELS, SIDES, placement, probe_repository
from models.backends.devices import CUDA_PROVIDER

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"

cpu_build_only = pytest.mark.skipif(
    CUDA_PROVIDER in ort.get_available_providers(),
    reason="this onnxruntime has CUDA: tests/gpu and the GPU lane run the benchmark",
)


@pytest.mark.slow
@cpu_build_only
def test_without_a_gpu_the_cuda_side_stops_before_measuring(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "bench", "gpu", "--quick", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("iotgw bench gpu:")]
    assert "cuda side needs every model on cuda:0" in line
    assert "vision_cnn (onnxruntime): READY on cpu, CUDAExecutionProvider not available" in line
    assert "sensor_mlp_int8_tf (tensorflow): READY on cpu" in line
    assert "iotgw bench http" not in done.stdout  # nothing measured
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_the_cpu_side_finds_every_model_on_the_cpu(tmp_path: Path) -> None:
    side, env = SIDES[1]
    assert (side, dict(env)) == ("cpu", {"CUDA_VISIBLE_DEVICES": ""})
    rows = placement(side, env, probe_repository(tmp_path / "repo"), tmp_path, 240)
    assert sorted(row["model"] for row in rows) == sorted(PROBE_MODELS)
    assert all((row["state"], row["device"]) == ("READY", "cpu") for row in rows), rows


def test_summary_of_two_sides() -> None:
    """The committed CPU results as the cuda side, and as the cpu side with the CNN's gateway
    throughput and the fully connected model's fp32 latency doubled: those ratios are 1/2, the
    others 1, and each side keeps its own figures."""
    http = json.loads((RESULTS / "http.json").read_text())["summary"]
    quant = json.loads((RESULTS / "quant.json").read_text())["summary"]
    slower = {**http, "cnn_gateway_rows_per_s": 2 * http["cnn_gateway_rows_per_s"]}
    longer = {**quant, "fc_fp32_batch1_ms": 2 * quant["fc_fp32_batch1_ms"]}
    summary = summarize(
        {
            "cuda": {"http": {"summary": http}, "quant": {"summary": quant}},
            "cpu": {"http": {"summary": slower}, "quant": {"summary": longer}},
        }
    )
    assert summary["cnn_gateway_throughput_cuda_vs_cpu"] == 0.5
    assert summary["fc_fp32_batch1_latency_cuda_vs_cpu"] == 0.5
    assert summary["fc_int4_batch1_latency_cuda_vs_cpu"] == 0.5  # fp32 latency x int4 ratio
    assert summary["cnn_limit_throughput_cuda_vs_cpu"] == 1.0
    assert summary["gateway_p50_ms_cuda_vs_cpu"] == 1.0
    assert summary["cnn_gateway_rows_per_s_cuda"] == http["cnn_gateway_rows_per_s"]
    assert summary["cnn_gateway_rows_per_s_cpu"] == slower["cnn_gateway_rows_per_s"]
    fp32, ratio = quant["fc_fp32_batch1_ms"], quant["int4_batch1_latency_ratio"]
    assert summary["fc_int4_batch1_ms_cuda"] == round(fp32 * ratio, 4)
