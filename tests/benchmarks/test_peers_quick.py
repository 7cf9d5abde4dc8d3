"""``iotgw bench peers --quick`` runs the whole pipeline against a real MLServer and a real
Triton (each installed once into pytest's cache folder, then reused) and writes a results file
of the agreed shape. Where a peer cannot be installed the benchmark runs without its arm and
says why, and the tests of that peer's arm are skipped with the reason (shown by ``-ra``): they
never pass without it. No timing is asserted: benchmarks are not tests (see benchmarks.md)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

from benchmarks.peers.peer_env import PeerUnavailable, ensure_mlserver, ensure_triton
from benchmarks.peers.plan import (
    ARMS,
    GATEWAY,
    GATEWAY_GRPC,
    GATEWAY_STATIC,
    GATEWAY_STATIC_GRPC,
    GRPC_ARMS,
    JSON_ARMS,
    MLSERVER,
    MODELS,
    QUICK,
    STATIC_KNOBS,
    TARGETS,
    TRITON,
    TRITON_GRPC,
    TRITON_TARGETS,
)
from tests.benchmarks.bench_process import run_bench

pytestmark = pytest.mark.slow


@pytest.fixture(name="cache_dir", scope="module")
def _cache_dir(pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache that outlives the test run (pytest's own cache folder), so that the peers'
    environments are built once (about 3 s each, after 25-30 s downloading their wheels) rather
    than on every run; a temporary one when pytest runs without its cache."""
    cache = getattr(pytestconfig, "cache", None)
    return Path(cache.mkdir("iotgw-peers")) if cache is not None else tmp_path_factory.mktemp("c")


@pytest.fixture(name="uninstallable", scope="module")
def _uninstallable(cache_dir: Path) -> dict[str, str]:
    """Why each peer that cannot be installed here cannot (none: both are, or can be)."""
    why: dict[str, str] = {}
    for arm, ensure in ((MLSERVER, ensure_mlserver), (TRITON, ensure_triton)):
        try:
            ensure(cache_dir, log=lambda _: None)
        except PeerUnavailable as exc:
            why[arm] = str(exc)
    return why


def _require(uninstallable: dict[str, str], arm: str) -> None:
    """Skip, with the reason, a test of a peer's arm that cannot be installed here."""
    if arm in uninstallable:
        pytest.skip(f"{arm}: the peer cannot be installed here: {uninstallable[arm]}")


@pytest.fixture(name="quick", scope="module")
def _quick(
    cache_dir: Path, uninstallable: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> tuple[dict[str, Any], str]:
    out = tmp_path_factory.mktemp("bench")
    proc = run_bench(
        *("gateway.cli", "bench", "peers", "--quick", "--out", str(out)),
        env={**os.environ, "IOTGW_CACHE_DIR": str(cache_dir)},
    )
    assert sorted(p.name for p in out.iterdir()) == ["peers.quick.json"]
    return json.loads((out / "peers.quick.json").read_text()), proc.stdout


def test_top_level_shape(quick: tuple[dict[str, Any], str]) -> None:
    doc, stdout = quick
    assert (doc["benchmark"], doc["quick"]) == ("peers", True)
    assert isinstance(doc["created"], str) and "T" in doc["created"]
    assert doc["machine"]["cores"] >= 1 and doc["machine"]["packages"]["onnxruntime"]
    knobs = doc["config"]["gateway_static"]["knobs"]
    assert knobs == {m: STATIC_KNOBS[m].as_dict() for m in MODELS}  # as the gateway reports
    assert doc["config"]["batching"]["static_knobs"] == knobs
    assert "--no-tuner" in doc["config"]["gateway_static"]["argv"]
    assert "--no-tuner" not in doc["config"]["gateway"]["argv"]  # the default serve, agent on
    assert "Summary vs MLServer" in stdout and "Summary vs Triton" in stdout
    assert "peers.quick.json" in stdout


def test_a_peer_that_cannot_be_installed_is_skipped_with_its_reason(
    quick: tuple[dict[str, Any], str], uninstallable: dict[str, str]
) -> None:
    summary = quick[0]["summary"]
    for arm, pinned in ((MLSERVER, "mlserver==1.7.1"), (TRITON, "nvidia-pytriton==0.7.0")):
        skipped = summary[f"{arm.removesuffix('_json')}_skipped"]
        if arm in uninstallable:
            assert skipped and pinned in skipped
        else:
            assert skipped is None


def test_mlserver_arm_runs(
    quick: tuple[dict[str, Any], str], uninstallable: dict[str, str]
) -> None:
    _require(uninstallable, MLSERVER)
    summary = quick[0]["summary"]
    assert summary["mlserver_skipped"] is None
    assert summary["mlserver_version"] == "1.7.1"
    mlserver = quick[0]["config"]["mlserver"]
    assert mlserver["settings"]["parallel_workers"] == 1
    # Both servers answered every arm's request as the runtime computes it before any timing.
    assert MLSERVER in quick[0]["config"]["reply_check_max_abs_diff"]
    for model in MODELS:
        for key in TARGETS:
            for name in (key, f"binary_{key}"):
                value = summary[model][name]
                assert isinstance(value, float) and math.isfinite(value) and value > 0, name
        assert set(summary[model]["meets_targets"]) == set(TARGETS)


def test_triton_arm_runs(quick: tuple[dict[str, Any], str], uninstallable: dict[str, str]) -> None:
    _require(uninstallable, TRITON)
    doc = quick[0]
    summary = doc["summary"]
    assert (summary["triton_skipped"], summary["triton_version"]) == (None, "0.7.0")
    assert TRITON in doc["config"]["reply_check_max_abs_diff"]
    # Triton batches as the static gateway does, with its instances and threads.
    for spec in doc["config"]["triton"]["config"]["models"]:
        knobs = STATIC_KNOBS[spec["name"]]
        assert spec["max_batch_size"] == knobs.max_batch_size
        assert spec["max_queue_delay_us"] == round(knobs.batch_timeout_ms * 1000)
        assert spec["instances"] == knobs.concurrency
        assert (spec["intra_op_threads"], spec["inter_op_threads"]) == (
            knobs.intra_op_threads,
            knobs.inter_op_threads,
        )
    measured = (
        "vs_triton_throughput_ratio_c32",
        "vs_triton_p99_ratio_c32",
        "vs_triton_p50_ratio_c1",
    )
    for model in MODELS:
        s = summary[model]
        for key in TRITON_TARGETS:  # each beside its floor and its verdict
            assert {key, f"{key}_noise_floor", f"{key}_judged"} <= set(s), key
            assert isinstance(s[f"{key}_judged"], str)
        for key in measured:  # the quick plan's loads: 1 and 32 connections
            for name in (key, f"static_{key}", f"loadgen_{key}"):
                assert isinstance(s[name], float) and math.isfinite(s[name]) and s[name] > 0, name
        # Not measured in the quick plan: said so, never passed.
        assert s["vs_triton_throughput_ratio_c8_judged"] == "missed: no figure"
        caps = s["capacity_rps"]
        assert set(caps) == {a for a in JSON_ARMS if a not in uninstallable}
        assert all(len(v) == QUICK.capacity_repeats for v in caps.values())


def test_open_loop_searches_every_json_arm(
    quick: tuple[dict[str, Any], str], uninstallable: dict[str, str]
) -> None:
    rows = [r for r in quick[0]["runs"] if r["figure"] == "peer_capacity"]
    arms = {a for a in JSON_ARMS if a not in uninstallable}
    assert {(r["model"], r["arm"]) for r in rows} == {(m, a) for m in MODELS for a in arms}
    for r in rows:
        assert 1 <= len(r["steps"]) <= QUICK.max_open_steps
        assert r["steps"][0]["rate_rps"] == r["start_rps"] > 0
        for step in r["steps"]:
            assert step["passed"] == (step["why"] is None)
            assert step["requests"] > 0 and step["lost"] >= 0
        passed = [s["rate_rps"] for s in r["steps"] if s["passed"]]
        assert r["capacity_rps"] == (max(passed) if passed else None)


def test_wrk_measures_every_json_arm(
    quick: tuple[dict[str, Any], str], uninstallable: dict[str, str]
) -> None:
    doc = quick[0]
    arms = {a for a in JSON_ARMS if a not in uninstallable}
    points = [r for r in doc["runs"] if r["figure"] == "peer_wrk_point"]
    expected = {(m, c) for m in MODELS for c in QUICK.wrk_concurrency}
    assert {(p["model"], p["connections"]) for p in points} == expected
    for p in points:
        assert set(p["arms"]) == arms
        for fig in p["arms"].values():
            assert fig["requests_per_s"] > 0 and fig["failed"] >= 0
        if TRITON in arms:
            assert set(p["vs_triton"]) == {GATEWAY, GATEWAY_STATIC}
    runs = [r for r in doc["runs"] if r["figure"] == "peer_wrk_run"]
    assert len(runs) == len(expected) * len(arms) * QUICK.repeats


def test_h2load_measures_every_grpc_arm(
    quick: tuple[dict[str, Any], str], uninstallable: dict[str, str]
) -> None:
    """Over gRPC every arm answered what the runtime computes before any timing, every call
    h2load saw answered was counted as a success by the server itself, and the gateway's
    ratios to Triton's gRPC endpoint are judged as over HTTP."""
    doc = quick[0]
    arms = {a for a in GRPC_ARMS if not (a == TRITON_GRPC and TRITON in uninstallable)}
    assert arms <= set(doc["config"]["reply_check_max_abs_diff"])
    points = [r for r in doc["runs"] if r["figure"] == "peer_grpc_point"]
    expected = {(m, c) for m in MODELS for c in QUICK.grpc_concurrency}
    assert {(p["model"], p["connections"]) for p in points} == expected
    for p in points:
        assert set(p["arms"]) == arms
        for fig in p["arms"].values():
            assert fig["requests_per_s"] > 0 and fig["failed"] == 0
    runs = [r for r in doc["runs"] if r["figure"] == "peer_grpc_run"]
    assert len(runs) == len(expected) * len(arms) * QUICK.repeats
    for r in runs:  # the server's own count agrees with what h2load saw answered
        assert r["served_by_server"] >= r["answered"] > 0
    assert doc["summary"]["grpc_failed_requests"] == dict.fromkeys(GRPC_ARMS, 0)
    if TRITON in uninstallable:
        return
    for model in MODELS:
        s = doc["summary"][model]
        for key in ("grpc_vs_triton_grpc_throughput_ratio_c32", "grpc_vs_triton_grpc_p50_ratio_c1"):
            for name in (key, f"static_{key}"):
                assert isinstance(s[name], float) and s[name] > 0, name
        assert isinstance(s["grpc_vs_triton_grpc_throughput_ratio_c32_judged"], str)
    assert {GATEWAY_GRPC, GATEWAY_STATIC_GRPC} == set(points[0]["vs_triton_grpc"])


def test_every_point_measures_every_arm(
    quick: tuple[dict[str, Any], str], uninstallable: dict[str, str]
) -> None:
    doc = quick[0]
    arms = set(ARMS) - set(uninstallable)
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
