"""``iotgw bench peers --quick`` runs the whole pipeline against a real MLServer (installed once
into pytest's cache folder, then reused) and writes a results file of the agreed shape; where
MLServer cannot be installed, the MLServer arm is skipped with its reason instead. No timing is
asserted: benchmarks are not tests (see benchmarks.md)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.peers.mlserver_env import MLServerUnavailable, ensure_mlserver
from benchmarks.peers.plan import ARMS, MLSERVER, MODELS, QUICK, TARGETS

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(name="cache_dir", scope="module")
def _cache_dir(pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache that outlives the test run (pytest's own cache folder), so that MLServer's
    environment is built once (~20 s) rather than on every run; a temporary one when pytest
    runs without its cache."""
    cache = getattr(pytestconfig, "cache", None)
    return Path(cache.mkdir("iotgw-peers")) if cache is not None else tmp_path_factory.mktemp("c")


@pytest.fixture(name="installable", scope="module")
def _installable(cache_dir: Path) -> str | None:
    """None when MLServer is installed (or can be, here); else why not."""
    try:
        ensure_mlserver(cache_dir, log=lambda _: None)
    except MLServerUnavailable as exc:
        return str(exc)
    return None


@pytest.fixture(name="quick", scope="module")
def _quick(
    cache_dir: Path, installable: str | None, tmp_path_factory: pytest.TempPathFactory
) -> tuple[dict[str, Any], str]:
    out = tmp_path_factory.mktemp("bench")
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "bench", "peers", "--quick", "--out", str(out)],
        cwd=REPO_ROOT,
        env={**os.environ, "IOTGW_CACHE_DIR": str(cache_dir)},
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert sorted(p.name for p in out.iterdir()) == ["peers.quick.json"]
    return json.loads((out / "peers.quick.json").read_text()), proc.stdout


def test_top_level_shape(quick: tuple[dict[str, Any], str]) -> None:
    doc, stdout = quick
    assert (doc["benchmark"], doc["quick"]) == ("peers", True)
    assert isinstance(doc["created"], str) and "T" in doc["created"]
    assert doc["machine"]["cores"] >= 1 and doc["machine"]["packages"]["onnxruntime"]
    assert doc["config"]["batching"]["max_batch_size"] == 32
    assert doc["config"]["batching"]["batch_timeout_ms"] == 2.0
    for knobs in doc["config"]["gateway"]["knobs"].values():
        assert (knobs["max_batch_size"], knobs["batch_timeout_ms"]) == (32, 2.0)
    assert "Summary" in stdout and "peers.quick.json" in stdout


def test_mlserver_arm_runs_where_it_can_be_installed(
    quick: tuple[dict[str, Any], str], installable: str | None
) -> None:
    summary = quick[0]["summary"]
    if installable is not None:  # no registry and nothing cached: skipped, and why
        assert summary["mlserver_skipped"] and "mlserver==1.7.1" in summary["mlserver_skipped"]
        return
    assert summary["mlserver_skipped"] is None
    assert summary["mlserver_version"] == "1.7.1"
    mlserver = quick[0]["config"]["mlserver"]
    assert mlserver["settings"]["parallel_workers"] == 1
    # Both servers answered every arm's request as the runtime computes it before any timing.
    assert set(quick[0]["config"]["reply_check_max_abs_diff"]) == set(ARMS)
    for model in MODELS:
        for key in TARGETS:
            for name in (key, f"binary_{key}"):
                value = summary[model][name]
                assert isinstance(value, float) and math.isfinite(value) and value > 0, name
        assert set(summary[model]["meets_targets"]) == set(TARGETS)


def test_every_point_measures_every_arm(quick: tuple[dict[str, Any], str]) -> None:
    doc = quick[0]
    arms = set(ARMS) if doc["summary"]["mlserver_skipped"] is None else set(ARMS) - {MLSERVER}
    points = [r for r in doc["runs"] if r["figure"] == "peer_point"]
    expected = {
        (m, rows, c) for m in MODELS for rows in QUICK.rows_per_request for c in QUICK.concurrency
    }
    assert {(p["model"], p["rows_per_request"], p["concurrency"]) for p in points} == expected
    for p in points:
        assert set(p["arms"]) == arms
        for fig in p["arms"].values():
            assert fig["lost"] >= 0
            if p["rows_per_request"] == 1:  # the summary's points: answered in a quick window
                assert fig["answered"] > 0 and fig["rows_per_s"]["median"] > 0
    runs = [r for r in doc["runs"] if r["figure"] == "peer_run"]
    assert len(runs) == len(expected) * len(arms) * QUICK.repeats
    assert all(r["server_cpu_cores"] >= 0 for r in runs)
