"""``iotgw bench grpc --quick``: gRPC on the event loop, HTTP on the loop and HTTP through one
ingest process, a fixed number of requests each, and gRPC against HTTP JSON at 32 calls. Every
arm must serve all of them, and the results file must carry the figures the placement decision
in docs/architecture.md reads and the ratio issue 33's target names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks.bench_process import run_bench

pytestmark = pytest.mark.slow


def test_bench_grpc_quick_serves_every_arm(tmp_path: Path) -> None:
    run_bench("gateway.cli", "bench", "grpc", "--quick", "--out", str(tmp_path))
    doc = json.loads((tmp_path / "grpc.quick.json").read_text())
    assert doc["benchmark"] == "grpc" and doc["quick"] is True
    assert {r["arm"] for r in doc["runs"]} == {
        "grpc_loop",
        "http_loop",
        "http_ingest1",
        "grpc_loop_c32",
        "http_json_loop_c32",
    }
    # The comparison issue 33's target names: gRPC against HTTP JSON, 32 calls at once.
    assert {r["concurrency"] for r in doc["runs"] if r["arm"].endswith("_c32")} == {32}
    for run in doc["runs"]:
        assert run["rps"] > 0 and run["failed"] == 0, run
        assert run["cpu_ms_per_request"] > 0, run
    for figure in (
        "ingest_hop_throughput_ratio",
        "grpc_vs_http_binary_throughput_ratio",
        "grpc_vs_http_json_throughput_ratio_c32",
    ):
        assert doc["summary"][figure] > 0
    # One round in quick mode: nothing measured twice, so the target is not judged.
    judged = doc["summary"]["grpc_vs_http_json_throughput_ratio_c32_judged"]
    assert judged == "unresolved: no noise floor measured"
