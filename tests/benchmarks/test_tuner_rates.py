"""``--rates-from``: a rerun of ``iotgw bench tuner`` replays the phase rates of an earlier
results file (so the same seed sends the very same arrivals), whatever capacity this run
measures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.tuner.cli import cli
from benchmarks.tuner.scenarios import SCENARIOS, Capacity, pinned_capacity, resolve

RESULTS = Path(__file__).parents[2] / "benchmarks" / "results" / "tuner_e2e.json"


def test_the_committed_capacities_give_back_every_phase_rate_the_committed_run_sent() -> None:
    doc = json.loads(RESULTS.read_text(encoding="utf-8"))
    checked = 0
    for name, config in doc["config"]["scenarios"].items():
        for stream in SCENARIOS[name].streams:
            rps = pinned_capacity(RESULTS, name, stream.model)
            phases = resolve(stream, Capacity(rps, {}))
            sent = config["models"][stream.model]["phases"]
            assert [(p.name, p.rate_per_s) for p in phases] == [
                (p["name"], p["rate_per_s"]) for p in sent
            ], (name, stream.model)
            checked += 1
    assert checked >= 6  # five scenarios, one of them with two models


def test_a_file_pinned_from_another_hands_on_the_rates_it_used(tmp_path: Path) -> None:
    models = {"sensor_mlp": {"capacity_rps": {"max": 2112.7, "batch1": 730.7}}}
    pinned = {**models["sensor_mlp"], "rates_of_capacity_rps": {"max": 2888.0, "batch1": 1089.3}}
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    for path, model in ((first, models["sensor_mlp"]), (second, pinned)):
        doc = {"config": {"scenarios": {"sensor_mlp": {"models": {"sensor_mlp": model}}}}}
        path.write_text(json.dumps(doc), encoding="utf-8")
    assert pinned_capacity(first, "sensor_mlp", "sensor_mlp") == {"max": 2112.7, "batch1": 730.7}
    assert pinned_capacity(second, "sensor_mlp", "sensor_mlp")["max"] == 2888.0
    with pytest.raises(ValueError, match="no capacity of vision_cnn in sensor_mlp"):
        pinned_capacity(first, "sensor_mlp", "vision_cnn")


def test_a_file_without_the_scenario_is_refused_before_anything_is_measured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    only_sensor = tmp_path / "only_sensor.json"
    doc: dict[str, Any] = {"config": {"scenarios": {"sensor_mlp": {"models": {"sensor_mlp": {}}}}}}
    only_sensor.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(SystemExit) as exit_:
        cli(["--scenarios", "shared_cores", "--rates-from", str(only_sensor), "--out", "x"])
    assert exit_.value.code == 2
    assert "no capacity of sensor_mlp in shared_cores" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli(["--scenarios", "vision_cnn", "--rates-from", str(tmp_path / "missing.json")])
    assert "No such file" in capsys.readouterr().err


def test_the_committed_run_measured_every_scenario_on_one_commit() -> None:
    # A file whose scenarios were kept from runs on other code would compare agents that
    # differ; each scenario records the commit its gateways started from.
    doc = json.loads(RESULTS.read_text(encoding="utf-8"))
    code = doc["config"]["code"]
    assert code is not None and not code.endswith("+changes")
    assert {c["measured"]["code"] for c in doc["config"]["scenarios"].values()} == {code}
