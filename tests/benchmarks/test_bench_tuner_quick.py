"""``iotgw bench tuner --quick`` runs every arm end to end (gateway process, simulator, online
agents) and writes a results file of the agreed shape. No latency figure is asserted: benchmarks
are not tests (see benchmarks.md); what is asserted is what must hold whatever the machine: every
request accounted for, none lost, the online arms' agents decided, the static arms kept their
knobs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_quick_run(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "bench", "tuner", "--quick", "--out", str(tmp_path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=420,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tuner_e2e.quick.json"]
    doc = json.loads((tmp_path / "tuner_e2e.quick.json").read_text())
    assert (doc["benchmark"], doc["quick"]) == ("tuner_e2e", True)
    runs = {r["arm"]: r for r in doc["runs"]}
    assert set(runs) == {"static-default", "static-best-first", "bo", "rrl", "adaptive-rrl"}
    planned = {r["overall"]["requests"] for r in runs.values()}
    assert len(planned) == 1, "every arm must see the same scenario"
    phases = [p["name"] for p in doc["config"]["phases"]]
    for arm, r in runs.items():
        assert list(r["phases"]) == phases
        assert sum(p["requests"] for p in r["phases"].values()) == r["overall"]["requests"]
        assert r["overall"]["lost"] == 0, arm
        if arm.startswith("static"):
            assert r["tuner"] is None
            assert r["final_knobs"] == pytest.approx(r["start_knobs"]), arm
        else:
            counts = r["tuner"]["decision_counts"]
            assert sum(counts.values()) >= 1, arm
    assert runs["static-default"]["start_knobs"] == doc["config"]["static_default"]
    for key in ("p95_reduction_vs_default", "slo_violation_reduction_vs_best_static"):
        assert key in doc["summary"]


def test_another_burst_rate_is_another_results_file() -> None:
    from benchmarks.tuner import FULL, QUICK, results_name, with_burst_rate

    assert results_name(FULL) == results_name(QUICK) == "tuner_e2e"
    burst256 = with_burst_rate(FULL, 256.0)
    assert results_name(burst256) == "tuner_e2e_burst256"
    assert [p.rate_per_s for p in burst256.phases] == [16.0, 256.0, 128.0, 16.0]
