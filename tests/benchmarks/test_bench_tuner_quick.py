"""``iotgw bench tuner --quick`` end to end on two short arms: the per-phase oracle (which needs
the capacity ramp, the service times and the trace replay before it runs, and switches knobs at
the phase boundaries) and the online agent (which must start from the expert default by itself).
No latency figure is asserted: benchmarks are not tests (see benchmarks.md); what is asserted is
what must hold whatever the machine: every request accounted for, none lost, the oracle ended on
its last phase's configuration, the agent started from the expert default and decided."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_quick_run_oracle_and_agent(tmp_path: Path) -> None:
    argv = [
        "--quick",
        "--scenarios",
        "sensor_mlp",
        "--arms",
        "oracle,agent",
        "--out",
        str(tmp_path),
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.tuner", *argv],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=420,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tuner_e2e.quick.json"]
    doc = json.loads((tmp_path / "tuner_e2e.quick.json").read_text())
    assert (doc["benchmark"], doc["quick"]) == ("tuner_e2e", True)
    config = doc["config"]["scenarios"]["sensor_mlp"]
    assert set(config["capacity_rps"]) == {"max", "batch1"}
    runs = {r["arm"]: r for r in doc["runs"]}
    assert set(runs) == {"oracle", "agent"}
    assert len({r["overall"]["requests"] for r in runs.values()}) == 1, "same trace for every arm"
    phases = [p["name"] for p in config["phases"]]
    for arm, r in runs.items():
        assert list(r["phases"]) == phases
        assert sum(p["requests"] for p in r["phases"].values()) == r["overall"]["requests"]
        assert r["overall"]["lost"] == 0, arm
    oracle = runs["oracle"]
    last = oracle["switches"][-1][1] if oracle["switches"] else oracle["start_knobs"]
    assert oracle["final_knobs"] == pytest.approx(last)
    agent = runs["agent"]
    assert agent["start_knobs"] == config["expert_default"]
    assert sum(agent["tuner"]["decision_counts"].values()) >= 1
    summary = doc["summary"]["sensor_mlp"]
    for key in ("violations_vs_best_static", "gap_to_oracle_p95", "settle_s"):
        assert key in summary
