"""``iotgw bench ingest --quick``: the gateway pinned to one core with 0 and 2 ingest processes,
under a closed loop of JSON requests. Every arm must serve (nothing lost, nothing refused) and
the results file must carry the figures and ratios the summary names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.common import source_commit
from tests.benchmarks.bench_process import run_bench

pytestmark = pytest.mark.slow


def test_bench_ingest_quick_serves_every_arm(tmp_path: Path) -> None:
    run_bench("gateway.cli", "bench", "ingest", "--quick", "--out", str(tmp_path))
    doc = json.loads((tmp_path / "ingest.quick.json").read_text())
    assert doc["benchmark"] == "ingest" and doc["quick"] is True
    assert doc["config"]["code"] == source_commit()  # the checkout the run started from
    arms = {(r["model"], r["cores"], r["ingest_processes"]) for r in doc["runs"]}
    assert arms == {(m, 1, p) for m in ("sensor_mlp", "vision_cnn") for p in (0, 2)}
    for run in doc["runs"]:
        assert run["rps"] > 0 and run["lost"] == 0 and not run["errors"], run
        assert run["cpu_ms_per_request"] > 0, run
    summary = doc["summary"]
    for model in ("sensor_mlp", "vision_cnn"):
        assert summary[f"{model}_c1_ingest2_throughput_ratio"] > 0
        assert summary[f"{model}_c1_best_ingest_throughput_ratio"] > 0
