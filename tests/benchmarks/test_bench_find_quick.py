"""``iotgw bench find --quick`` runs the whole pipeline (static grid, finalists twice, agent
runs from two starts, closed and open loop) and writes a results file of the agreed shape. No
figure is asserted: benchmarks are not tests (see benchmarks.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.find.measure import LOGGED_KINDS
from benchmarks.find.plan import QUICK
from tests.benchmarks.bench_process import run_bench

pytestmark = pytest.mark.slow


def test_quick_find_writes_every_figure_with_its_floor(tmp_path: Path) -> None:
    run_bench("gateway.cli", "bench", "find", "--quick", "--out", str(tmp_path))
    doc = json.loads((tmp_path / "tuner_find.quick.json").read_text(encoding="utf-8"))
    summary = doc["summary"]
    static = next(r for r in doc["runs"] if r["kind"] == "static")
    for key, floor, target, load in (
        ("worst_throughput_vs_best_static", "throughput_noise_floor", "throughput_target", "c8"),
        ("worst_p99_vs_best_static", "p99_noise_floor", "p99_target", "open0.5"),
    ):
        if summary[key] is not None:
            assert summary[key] > 0 and summary[floor] >= 1.0, summary
            continue
        # No figure only when no static served both its runs without a refusal (a busy
        # machine's seconds-long points), or, for the open load, when no probe of the open
        # loop's capacity held (the simulator fell behind at every rate on a busy machine), so
        # that the load had no rate to run at and measured nothing: said so, never read as a
        # target met.
        assert static["best"][load]["value"] is None, static["best"]
        rows = static["loads"][load]
        if load.startswith("open") and static["open_capacity_rps"] == 0:
            assert rows == [], rows
        else:
            refused: dict[str, bool] = {}
            for r in rows:
                knobs = json.dumps(r["knobs"], sort_keys=True)
                bad = bool(r.get("failed") or r.get("errors") or r.get("lost"))
                refused[knobs] = refused.get(knobs, False) or bad
            assert refused and all(refused.values()), rows
        assert summary[target] == "missed: no figure", summary
    assert {"throughput_target", "p99_target", "settle_target"} <= set(summary)
    assert {"throughput_adjacent_target", "p99_adjacent_target"} <= set(summary)
    assert static["finalists"] and static["screened"] and static["capacity_rps"] > 0
    # The open loop's own capacity: probed from wrk's down, highest first, to the first rate
    # the simulator kept up with and the gateway answered in full (0 when none did).
    probes = static["open_capacity_probes"]
    assert probes and [p["fraction"] for p in probes] == sorted(
        (p["fraction"] for p in probes), reverse=True
    )
    assert all(not p["held"] for p in probes[:-1])
    if static["open_capacity_rps"] > 0:
        last = probes[-1]
        assert last["held"] and last["kept_up"] and not last["errors"] and not last["lost"]
        assert static["open_capacity_rps"] == last["achieved_rps"]
    agents = [r for r in doc["runs"] if r["kind"] == "agent"]
    # An open load with no rate to run at has no agent runs either.
    loads = ("c8", "open0.5") if static["open_capacity_rps"] > 0 else ("c8",)
    assert {(r["load"], r["start"]) for r in agents} == {
        (load, start) for load in loads for start in ("default", "batch1")
    }
    starts = {s.name: s for s in QUICK.starts}
    for r in agents:
        assert r["final_knobs"] and r["decisions"], r
        # The load met the start's knobs, not the agent's own start configuration: the
        # decision that records the load's first state names what served it.
        start = starts[r["start"]].knobs
        if start is not None:
            assert r["knobs_at_load"] == start.as_dict(), r["knobs_at_load"]
            assert (r["log"][0]["kind"], r["log"][0]["knobs"]) == ("workload", start.as_dict())
        # The load's best static, measured twice right after the run on a static gateway.
        if static["best"][r["load"]]["knobs"] is not None:
            pair = r["adjacent_static"]
            assert pair["knobs"] == static["best"][r["load"]]["knobs"] and len(pair["runs"]) == 2
        # What moved is logged with its reason, in time order, nothing that only rested.
        moved = sum(n for kind, n in r["decisions"].items() if kind in LOGGED_KINDS)
        assert len(r["log"]) == moved and all(e["reason"] for e in r["log"]), r["log"]
        assert [e["t"] for e in r["log"]] == sorted(e["t"] for e in r["log"])
        if r["load"] == "c8":
            # Every request answered: a refusal under a poor start's overload is an answer (a
            # 503 with its reason), a socket error or timeout is a loss.
            assert r["measured"]["lost"] == 0 and r["measured"]["requests"] > 0
        else:
            assert r["measured"]["lost"] == 0 and r["measured"]["ok"] > 0
