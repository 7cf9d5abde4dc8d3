"""``iotgw profile --quick`` and ``iotgw tune --evaluate --quick`` run end to end (as CI runs
them) and write files of the agreed shape; the committed profiles are complete tables. No timing
is asserted: these are measurements, not tests of speed."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rrl.offline.profiling import WINDOW_FIELDS
from rrl.offline.testbed import ProfileTable, Testbed
from rrl.tuners.objective import LatencyObjective
from rrl.tuners.registry import TUNERS
from tests.benchmarks.bench_process import run_bench

pytestmark = pytest.mark.slow
SUMMARY_KEYS = (  # benchmarks.md, tuner_eval.json
    "rrl_measurements_to_5pct",
    "qlearning_measurements_to_5pct",
    "bo_measurements_to_5pct",
    "rrl_final_gap",
    "adaptive_final_gap",
)


def _iotgw(*args: str) -> subprocess.CompletedProcess[str]:
    return run_bench("gateway.cli", *args)


def test_profile_quick(tmp_path: Path, mlp_repo: Path) -> None:
    _iotgw("profile", "--quick", "--out", str(tmp_path), "--model-repo", str(mlp_repo))
    path = tmp_path / "sensor_mlp.quick.json"
    doc = json.loads(path.read_text())
    assert doc["complete"] is True and doc["model"] == "sensor_mlp" and doc["grid"] == "quick"
    assert doc["window_fields"] == list(WINDOW_FIELDS)
    assert doc["machine"]["cores"] >= 1 and doc["load_conditions"]["load_average_by_group"]
    assert len(doc["cells"]) == 12 * 2  # every configuration at both loads
    for cell in doc["cells"]:
        assert len(cell["windows"]) == len(cell["samples"]) == 2
        for window, latencies in zip(cell["windows"], cell["samples"], strict=True):
            w = dict(zip(WINDOW_FIELDS, window, strict=True))
            assert w["offered"] >= 1 and 0 <= w["completed"] <= w["offered"]
            assert w["violations"] >= w["rejected"] >= 0
            # Each answered request's latency is recorded, sorted, for the testbed to pool.
            assert len(latencies) == w["completed"] and latencies == sorted(latencies)
            if w["completed"]:
                assert 0 < w["p50_ms"] <= w["p95_ms"] <= w["p99_ms"]
                assert latencies[0] > 0
                assert np.percentile(latencies, 95) == pytest.approx(
                    w["p95_ms"], rel=1e-3, abs=2e-3
                )
        assert cell["throughput_per_s"][0] > 0
    table = ProfileTable.load(path)
    testbed = Testbed(table, LatencyObjective(slo_ms=table.slo_ms), seed=0)
    for load in range(len(table.loads)):
        _, best = testbed.oracle(load)
        assert math.isfinite(best) and best > 0


@pytest.fixture(scope="module")
def evaluation(
    tmp_path_factory: pytest.TempPathFactory, mlp_repo: Path
) -> tuple[Path, dict[str, Any]]:
    # The evaluation replays a profile measured here and now (quick grid), so the pipeline
    # profile -> testbed -> every tuner -> report is checked end to end on this machine.
    profiles = tmp_path_factory.mktemp("profiles")
    _iotgw("profile", "--quick", "--out", str(profiles), "--model-repo", str(mlp_repo))
    (profiles / "sensor_mlp.quick.json").rename(profiles / "sensor_mlp.json")
    out = tmp_path_factory.mktemp("eval")
    proc = _iotgw(
        "tune",
        "--evaluate",
        "--quick",
        "--profile-dir",
        str(profiles),
        "--models",
        "sensor_mlp",
        "--out",
        str(out),
    )
    assert "tuner_eval.quick.json" in proc.stdout
    return out, json.loads((out / "tuner_eval.quick.json").read_text())


def test_evaluation_quick_results(evaluation: tuple[Path, dict[str, Any]]) -> None:
    _, doc = evaluation
    assert doc["benchmark"] == "tuner_eval" and doc["quick"] is True
    assert doc["machine"]["cores"] >= 1
    for key in SUMMARY_KEYS:
        value = doc["summary"][key]
        assert value is None or (isinstance(value, int | float) and value >= 0), key
    assert set(doc["summary"]["targets"]) == {
        "rrl_8x_fewer_than_qlearning",
        "rrl_fewer_than_bo",
        "adaptive_within_2pct",
    }
    plan = doc["config"]["plan"]
    static = [r for r in doc["runs"] if r["kind"] == "static"]
    assert {r["tuner"] for r in static} == set(TUNERS)
    assert len(static) == len(TUNERS) * plan["seeds"]
    shifting = [r for r in doc["runs"] if r["kind"] == "shifting"]
    assert len(shifting) == len(TUNERS) * plan["seeds"]
    assert all(len(r["phases"]) == 4 for r in shifting)
    for r in static:
        assert r["final_gap"] >= 0 and r["violations"] >= 0
        m = r["measurements_to_5pct"]
        assert m is None or 1 <= m <= plan["budget"]
    assert doc["lipschitz"] and all(x["lipschitz_max"] >= 0 for x in doc["lipschitz"])


def test_evaluation_quick_report(evaluation: tuple[Path, dict[str, Any]]) -> None:
    out, _ = evaluation
    md = (out / "tuner_eval.quick.md").read_text()
    assert "| tuner |" in md and "rrl_measurements_to_5pct" in md
    pngs = sorted((out / "tuner_eval.quick").glob("*.png"))
    assert {p.name for p in pngs} >= {"measurements_to_5pct.png", "delta_tradeoff.png"}
    for png in pngs:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
        assert f"({png.parent.name}/{png.name})" in md
    # Medians of counts are printed exactly as the JSON holds them (whole or half numbers).
    _, doc = evaluation
    for tuner in ("rrl", "qlearning", "bo", "adaptive"):
        key = f"{tuner}_measurements_to_5pct"
        value = doc["summary"][key]
        shown = "never" if value is None else f"{value:g}"
        assert f"| `{key}` | {shown} |" in md


def test_report_prints_medians_of_counts_exactly() -> None:
    from rrl.offline.report import _fmt

    assert [_fmt(v) for v in (251.5, 100.5, 100.0, 0.0)] == ["251.5", "100.5", "100", "0"]
    assert [_fmt(v) for v in (7.9123, 1236.4, None)] == ["7.91", "1.24e+03", "never"]
