"""``iotgw bench tuner --quick`` end to end on two short arms per scenario: the per-phase oracle
(which needs the capacity ramps, the service times and the trace replay before it runs, and
switches knobs at the phase boundaries) and the online agent (which must start from the expert
default by itself). No latency figure is asserted: benchmarks are not tests (see benchmarks.md);
what is asserted is what must hold whatever the machine: the report's structure, every request
accounted for and none lost, the oracle ended on its last phase's configuration, the agent
started where it should and decided."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.common import source_commit
from benchmarks.tuner.report import SUMMARY_KEYS, phase_windows
from tests.benchmarks.bench_process import run_bench

pytestmark = pytest.mark.slow


def _quick(tmp_path: Path, scenario: str) -> dict[str, Any]:
    argv = ["--quick", "--scenarios", scenario, "--arms", "oracle,agent", "--out", str(tmp_path)]
    run_bench("benchmarks.tuner", *argv)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tuner_e2e.quick.json"]
    doc = json.loads((tmp_path / "tuner_e2e.quick.json").read_text())
    assert (doc["benchmark"], doc["quick"]) == ("tuner_e2e", True)
    assert list(doc["summary"]) == [scenario]
    summary = doc["summary"][scenario]
    for key in SUMMARY_KEYS:
        assert key in summary and f"{key}_seeds" in summary
    assert [s["seed"] for s in summary["per_seed"]] == [0]
    return dict(doc)


def _check_stream(arm: str, stream: dict[str, Any], config: dict[str, Any]) -> None:
    """Every request of the model's trace accounted for in its phases, none lost."""
    assert list(stream["phases"]) == [p["name"] for p in config["phases"]]
    assert sum(p["requests"] for p in stream["phases"].values()) == stream["overall"]["requests"]
    assert stream["overall"]["requests"] > 0
    assert stream["overall"]["lost"] == 0, arm
    assert set(config["capacity_rps"]) == {"max", "batch1"}
    # What the hypervisor took while each ramp ran: a contended capacity reading says so.
    assert set(config["capacity_cpu"]) == {"max", "batch1"}
    assert all(0 <= use["steal_share"] <= 1 for use in config["capacity_cpu"].values())


def test_quick_single_model_over_mqtt(tmp_path: Path) -> None:
    doc = _quick(tmp_path, "sensor_mlp_mqtt")
    config = doc["config"]["scenarios"]["sensor_mlp_mqtt"]
    assert config["transport"] == "mqtt"
    # The commit the run's gateways started from, for the file and for the scenario.
    assert doc["config"]["code"] == config["measured"]["code"] == source_commit()
    model = config["models"]["sensor_mlp"]
    runs = {r["arm"]: r for r in doc["runs"]}
    assert set(runs) == {"oracle", "agent"}
    assert len({r["overall"]["requests"] for r in runs.values()}) == 1, "same trace for every arm"
    for arm, r in runs.items():
        _check_stream(arm, r, model)
    oracle = runs["oracle"]
    last = oracle["switches"][-1][1]["sensor_mlp"] if oracle["switches"] else oracle["start_knobs"]
    assert oracle["final_knobs"] == pytest.approx(last)
    agent = runs["agent"]
    assert agent["start_knobs"] == config["agent_start"]["sensor_mlp"]
    assert sum(agent["tuner"]["decision_counts"].values()) >= 1
    # The loop's cost per request reaching the agent's model is asserted where the load is long
    # enough to be sure of it (tests/rrl/test_online.py): this 7 s trace can end before 200
    # requests pass between two of the agent's reads on a slow machine, and then it reads 0.
    assert agent["tuner"]["queue_model"]["loop_ms_per_request"] >= 0
    # What each arm cost: the loop served every request, and is part of the gateway's CPU.
    for arm, r in runs.items():
        cpu = r["cpu"]
        assert 0 < cpu["loop_s"] <= cpu["gateway_s"] + 0.05, arm
        assert cpu["model_process_s"] >= 0 and 0 <= cpu["steal_share"] <= 1, arm
    assert runs["oracle"]["cpu"]["model_process_s"] == 0  # no agent, no model process


def test_quick_two_models_sharing_the_cores(tmp_path: Path) -> None:
    doc = _quick(tmp_path, "shared_cores")
    config = doc["config"]["scenarios"]["shared_cores"]
    models = config["models"]
    assert set(models) == {"sensor_mlp", "vision_cnn"}
    runs = {r["arm"]: r for r in doc["runs"]}
    for arm, r in runs.items():
        assert set(r["streams"]) == set(models)
        for name, stream in r["streams"].items():
            _check_stream(arm, stream, models[name])
    for name in models:
        trace = {r["streams"][name]["overall"]["requests"] for r in runs.values()}
        assert len(trace) == 1, "same trace for every arm"
    # The oracle's switches name per-gateway configurations: one model's knobs or both.
    for _, per_model in runs["oracle"]["switches"]:
        assert set(per_model) <= set(models)
    predicted = runs["oracle"]["predicted"]
    assert len(predicted) == len(phase_windows(models["sensor_mlp"]["phases"]))
    assert all(set(p["models"]) == set(models) for p in predicted)


def test_quick_diurnal_windows(tmp_path: Path) -> None:
    doc = _quick(tmp_path, "diurnal")
    model = doc["config"]["scenarios"]["diurnal"]["models"]["sensor_mlp"]
    windows = phase_windows(model["phases"])
    assert [w["name"] for w in windows] == ["night", "morning", "afternoon", "evening"]
    for arm, r in ((r["arm"], r) for r in doc["runs"]):
        _check_stream(arm, r, model)
    settle = doc["summary"]["diurnal"]["per_seed"][0].get("settle_steps") or []
    assert [s["phase"] for s in settle] == ["morning", "afternoon", "evening"]
