"""The timeline and the charts say what happened: the last bin holds the replies to the last
requests (no false drop to 0), an errors chart of a run without errors says so, phases are named,
titles name model, transport and rate, and ``summary.json`` names the source and each phase's
process and rate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.patches import Rectangle

from device_sim.arrivals import Constant, OnOff
from device_sim.cli import main
from device_sim.ledger import Ledger, Outcome, Result
from device_sim.plan import plan_from_scenario
from device_sim.plots import errors_figure, latency_figure, rate_figure
from device_sim.scenario import Phase, Scenario, single_phase
from device_sim.summary import summarize
from tests.device_sim.conftest import Mosquitto
from tests.device_sim.responders import METADATA, MqttResponder

RUN = {"models": ["sensor_mlp"], "transport": "mqtt5"}


def answered(scenario: Scenario, latency_s: float, lose_every: int = 0) -> dict[str, Any]:
    """The summary of ``scenario`` with every request answered ``latency_s`` after its planned
    time (every ``lose_every``-th one lost)."""
    plan = plan_from_scenario(
        scenario,
        np.random.default_rng(0),
        ["d"],
        ["sensor_mlp"],
        max_requests=10**6,
        max_duration_s=1e9,
    )
    ledger = Ledger(len(plan), origin=0.0)
    for i, t in enumerate(plan.times.tolist()):
        if lose_every and i % lose_every == 0:
            ledger.record(i, Result(Outcome.LOST, t))
        else:
            ledger.record(i, Result(Outcome.OK, t, t + latency_s, 200))
    return summarize(plan, ledger, slo_ms=None, elapsed_s=plan.duration_s, run=RUN)


def test_the_last_bin_holds_the_last_replies() -> None:
    # 10 req/s for 2 s, answered 150 ms later: the last replies come after the window.
    summary = answered(single_phase(Constant(10), 2.0), 0.15)
    rows = summary["timeline"]
    assert len(rows) == 20  # bins of the offered window only, no near-empty tail bin
    assert rows[-1]["span_s"] == pytest.approx(0.15)  # 1.9 s to the last reply at 2.05 s
    assert rows[-1]["offered_rps"] == pytest.approx(10)
    # the replies at 1.95 s and 2.05 s, per second of the bin
    assert rows[-1]["ok"] == 2 and rows[-1]["achieved_rps"] == pytest.approx(2 / 0.15)
    assert sum(r["ok"] for r in rows) == summary["requests"]["ok"] == 20
    fig = rate_figure(summary)
    try:
        (offered, _achieved) = fig.axes[0].get_lines()
        x, y = np.asarray(offered.get_xdata()), np.asarray(offered.get_ydata())
        assert x[-1] == pytest.approx(2.05)  # drawn to the run's end
        assert y[-1] == pytest.approx(10)  # at the rate, not 0
        assert "sensor_mlp over MQTT 5, 10 req/s offered" in fig.axes[0].get_title()
        legend = fig.axes[0].get_legend()
        assert legend is not None
        # "status 200", so that it does not read as a count of replies
        assert [t.get_text() for t in legend.get_texts()] == [
            "offered",
            "achieved (replies with status 200)",
        ]
    finally:
        plt.close(fig)


def test_an_errors_chart_without_errors_says_so() -> None:
    fig = errors_figure(answered(single_phase(Constant(10), 2.0), 0.01))
    try:
        ax = fig.axes[0]
        assert [t.get_text() for t in ax.texts] == ["no errors, no lost requests"]
        assert not ax.patches and ax.get_legend() is None
    finally:
        plt.close(fig)
    fig = errors_figure(answered(single_phase(Constant(10), 2.0), 0.01, lose_every=4))
    try:
        bars = [p for p in fig.axes[0].patches if isinstance(p, Rectangle)]
        assert sum(p.get_height() for p in bars) == 5
    finally:
        plt.close(fig)


def test_phases_are_labelled_with_their_process_and_rate() -> None:
    scenario = Scenario((Phase("calm", 1.0, Constant(5)), Phase("burst", 1.0, OnOff(40, 0.5, 0.5))))
    summary = answered(scenario, 0.01)
    assert [(p["name"], p["process"], p["mean_rate"]) for p in summary["phases"]] == [
        ("calm", "constant", 5.0),
        ("burst", "onoff", 20.0),
    ]
    assert summary["phases"][1]["parameters"] == {
        "rate": 40.0,
        "on_s": 0.5,
        "off_s": 0.5,
        "off_rate": 0.0,
    }
    fig = rate_figure(summary)
    try:
        labels = [t.get_text().strip() for t in fig.axes[0].texts]
        assert labels == ["calm: constant 5/s", "burst: onoff 20/s"]
        # Neighbouring labels at two heights, so the labels of short phases do not overlap.
        heights = [t.get_position()[1] for t in fig.axes[0].texts]
        assert heights[0] != heights[1]
        # and above the data: no label sits on the highest points
        ax = fig.axes[0]
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
        highest = max(float(np.nanmax(line.get_ydata())) for line in ax.get_lines())
        highest_px = ax.transData.transform((0, highest))[1]
        assert all(t.get_window_extent(renderer).y0 > highest_px for t in ax.texts)
    finally:
        plt.close(fig)


async def test_summary_of_an_arrival_run_names_its_source(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    import asyncio

    metadata = tmp_path / "toy.json"
    metadata.write_text(json.dumps(METADATA))
    out = tmp_path / "out"
    argv = ["run", "--arrival", "poisson", "--rate", "20", "--duration", "1", "--model", "toy"]
    argv += ["--metadata", str(metadata), "--broker", mosquitto.url, "--out", str(out)]
    async with MqttResponder(mosquitto.port, service_s=0.002):
        assert await asyncio.to_thread(main, [*argv, "--quiet", "--no-plots"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["run"]["source"] == "arrival" and summary["run"]["source_file"] is None
    (phase,) = summary["phases"]
    assert (phase["process"], phase["parameters"], phase["mean_rate"]) == (
        "poisson",
        {"rate": 20.0},
        20.0,
    )


def test_the_legend_sits_outside_the_points() -> None:
    """Inside the axes the legend covered the last seconds' latency points."""
    fig = latency_figure(answered(single_phase(Constant(10), 2.0), 0.01))
    try:
        fig.canvas.draw()
        ax = fig.axes[0]
        renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
        legend = ax.get_legend()
        assert legend is not None
        legend_box = legend.get_window_extent(renderer)
        assert legend_box.x0 >= ax.get_window_extent(renderer).x1
        assert legend_box.x1 <= fig.bbox.x1  # and within the picture
    finally:
        plt.close(fig)


def two_models_answered(fast_s: float, slow_s: float) -> dict[str, Any]:
    """20 req/s for 2 s shared at random by ``fast`` and ``slow``, each request answered its
    model's latency after it was planned."""
    plan = plan_from_scenario(
        single_phase(Constant(20), 2.0),
        np.random.default_rng(0),
        ["d"],
        ["fast", "slow"],
        max_requests=10**6,
        max_duration_s=1e9,
    )
    ledger = Ledger(len(plan), origin=0.0)
    for i, (t, model) in enumerate(zip(plan.times.tolist(), plan.model.tolist(), strict=True)):
        latency_s = fast_s if plan.models[model] == "fast" else slow_s
        ledger.record(i, Result(Outcome.OK, t, t + latency_s, 200))
    run = {"models": list(plan.models), "transport": "mqtt5"}
    return summarize(plan, ledger, slo_ms=None, elapsed_s=plan.duration_s, run=run)


def test_each_model_has_its_own_lines() -> None:
    """Two models in one line described neither: a 10 ms and a 200 ms model averaged."""
    summary = two_models_answered(0.010, 0.200)
    by_name = {m["name"]: m for m in summary["models"]}
    assert set(by_name) == {"fast", "slow"}
    counts = [m["requests"]["planned"] for m in by_name.values()]
    assert all(counts) and sum(counts) == summary["requests"]["planned"] == 40
    assert by_name["fast"]["latency_ms"]["p99"] == pytest.approx(10)
    assert by_name["slow"]["latency_ms"]["p50"] == pytest.approx(200)
    # On the whole run's bins, the models' shares add up to the whole.
    for k, row in enumerate(summary["timeline"]):
        shares = [m["timeline"][k] for m in by_name.values()]
        assert [s["t"] for s in shares] == [row["t"]] * 2
        assert sum(s["offered"] for s in shares) == row["offered"]
        assert sum(s["ok"] for s in shares) == row["ok"]

    fig = latency_figure(summary)
    try:
        ax = fig.axes[0]
        lines = {line.get_label(): line for line in ax.get_lines()}
        assert list(lines) == ["fast p50", "fast p99", "slow p50", "slow p99"]
        legend = ax.get_legend()
        assert legend is not None
        assert [t.get_text() for t in legend.get_texts()] == list(lines)
        for name, latency_ms in (("fast", 10), ("slow", 200)):
            for percentile in ("p50", "p99"):
                y = np.asarray(lines[f"{name} {percentile}"].get_ydata(), dtype=float)
                assert np.isfinite(y).any()
                assert y[np.isfinite(y)] == pytest.approx(latency_ms)
            # a model's two lines share its colour, and the models' colours differ
            assert lines[f"{name} p50"].get_color() == lines[f"{name} p99"].get_color()
        assert lines["fast p50"].get_color() != lines["slow p50"].get_color()
    finally:
        plt.close(fig)

    fig = rate_figure(summary)
    try:
        ax = fig.axes[0]
        lines = {line.get_label(): line for line in ax.get_lines()}
        assert list(lines) == [
            "fast offered",
            "fast achieved (status 200)",
            "slow offered",
            "slow achieved (status 200)",
        ]
        for name in ("fast", "slow"):
            drawn = np.asarray(lines[f"{name} offered"].get_ydata(), dtype=float)[:-1]
            assert drawn == pytest.approx([r["offered_rps"] for r in by_name[name]["timeline"]])
        total = np.sum(
            [
                np.asarray(lines[f"{name} offered"].get_ydata(), dtype=float)
                for name in ("fast", "slow")
            ],
            axis=0,
        )
        assert total[:-1] == pytest.approx([r["offered_rps"] for r in summary["timeline"]])
    finally:
        plt.close(fig)


def test_one_model_keeps_the_whole_runs_lines() -> None:
    fig = latency_figure(answered(single_phase(Constant(10), 2.0), 0.01))
    try:
        assert [line.get_label() for line in fig.axes[0].get_lines()] == ["p50", "p95", "p99"]
    finally:
        plt.close(fig)
