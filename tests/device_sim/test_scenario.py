"""Scenario files and the plans built from them."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import pytest

from device_sim.arrivals import Constant, OnOff, Poisson
from device_sim.cli import main
from device_sim.plan import plan_from_scenario
from device_sim.scenario import load_scenario, parse_scenario

SCENARIO_TOML = """
[[phases]]
name = "light"
duration_s = 60
process = "poisson"
rate = 5

[[phases]]
name = "burst"
duration_s = 10
process = "onoff"
rate = 200
on_s = 1
off_s = 1
models = ["vision_cnn"]

[[phases]]
name = "step"
duration_s = 30
process = "constant"
rate = 50
"""


def test_toml_and_json_files_give_the_same_scenario(tmp_path: Path) -> None:
    toml_path = tmp_path / "s.toml"
    toml_path.write_text(SCENARIO_TOML)
    json_path = tmp_path / "s.json"
    json_path.write_text(json.dumps(tomllib.loads(SCENARIO_TOML)))
    scenario = load_scenario(toml_path)
    assert scenario == load_scenario(json_path)
    assert [p.name for p in scenario.phases] == ["light", "burst", "step"]
    assert scenario.phases[0].process == Poisson(5)
    assert scenario.phases[1].process == OnOff(200, 1, 1)
    assert scenario.phases[1].models == ("vision_cnn",)
    assert scenario.phases[2].process == Constant(50)
    assert scenario.duration_s == 100
    assert scenario.phase_starts() == [0, 60, 70]


def test_phases_follow_each_other_in_time(tmp_path: Path) -> None:
    scenario = parse_scenario(tomllib.loads(SCENARIO_TOML))
    schedule = scenario.sample(np.random.default_rng(0))
    assert np.all(np.diff(schedule.times) >= 0)
    for i, (start, phase) in enumerate(zip(scenario.phase_starts(), scenario.phases, strict=True)):
        times = schedule.times[schedule.phase == i]
        assert times.min() >= start and times.max() < start + phase.duration_s
    assert (schedule.phase == 2).sum() == 30 * 50  # the constant step is exact


def test_plan_assigns_devices_and_models_reproducibly() -> None:
    scenario = parse_scenario(tomllib.loads(SCENARIO_TOML))
    devices = [f"d{i}" for i in range(8)]

    def plan(seed: int):
        return plan_from_scenario(
            scenario,
            np.random.default_rng(seed),
            devices,
            ["sensor_mlp"],
            max_requests=10**6,
            max_duration_s=1e9,
        )

    a, b = plan(7), plan(7)
    np.testing.assert_array_equal(a.times, b.times)
    np.testing.assert_array_equal(a.device, b.device)
    np.testing.assert_array_equal(a.model, b.model)
    assert a.models == ("sensor_mlp", "vision_cnn")
    burst = a.phase == 1
    assert set(a.model[burst].tolist()) == {1}  # the burst names its own model
    assert set(a.model[~burst].tolist()) == {0}
    assert set(a.device.tolist()) == set(range(8))
    assert [p.name for p in a.phases] == ["light", "burst", "step"]


def test_plan_bounds_cut_the_schedule() -> None:
    scenario = parse_scenario(tomllib.loads(SCENARIO_TOML))
    rng = np.random.default_rng(1)
    short = plan_from_scenario(scenario, rng, ["d"], ["m"], max_requests=10**6, max_duration_s=65.0)
    assert short.duration_s == 65.0 and short.times.max() < 65.0
    assert [p.name for p in short.phases] == ["light", "burst"]
    few = plan_from_scenario(scenario, rng, ["d"], ["m"], max_requests=17, max_duration_s=1e9)
    assert len(few) == 17


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({}, "non-empty 'phases'"),
        ({"phases": [{"duration_s": 1}]}, "'process'"),
        ({"phases": [{"process": "poisson", "rate": 1}]}, "duration_s"),
        ({"phases": [{"process": "poisson", "rate": 1, "duration_s": -2}]}, "duration_s"),
        ({"phases": [{"process": "poisson", "duration_s": 1}]}, "rate"),
        ({"phases": [{"process": "poisson", "rate": 1, "duration_s": 1, "models": "m"}]}, "models"),
    ],
)
def test_bad_scenarios_name_the_problem(doc: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_scenario(doc)


def test_a_scenario_typo_is_one_line_naming_key_phase_and_valid_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = tmp_path / "typo.toml"
    scenario.write_text(
        "[[phases]]\nname = 'light'\nduration_s = 5\nprocess = 'poisson'\nrate = 5\n"
        "[[phases]]\nname = 'burst'\nduration_s = 5\nprocess = 'poisson'\nrat = 100\n"
    )
    assert main(["run", "--scenario", str(scenario), "--model", "m"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"iotgw sim run: {scenario}: phases[1] ('burst'): unknown key 'rat'; valid keys of a "
        "'poisson' phase: duration_s, models, name, process, rate"
    ]


def test_a_missing_process_parameter_is_named(tmp_path: Path) -> None:
    doc = {"phases": [{"process": "onoff", "rate": 1, "duration_s": 1, "on_s": 1}]}
    with pytest.raises(
        ValueError, match=r"phases\[0\] \('phase0'\): a 'onoff' process needs 'off_s'"
    ):
        parse_scenario(doc)
