"""The tuner bench's noise floor and per-arm CPU: the expert default measured twice gives the
figures two arms must differ by before a ratio between them says anything, and an arm's meter
counts the gateway's loop thread, its whole process and its child processes apart."""

from __future__ import annotations

import multiprocessing
import os
import time
from typing import Any

import pytest

from benchmarks.common import PROC_STAT_FIELDS, machine_busy_seconds, machine_cpu_seconds
from benchmarks.tuner.arms import REPEAT_ARM
from benchmarks.tuner.cpu import ArmMeter
from benchmarks.tuner.report import median_summary, seed_summary

PHASES = [
    {"name": "trickle", "start_s": 0.0, "duration_s": 10.0},
    {"name": "burst", "start_s": 10.0, "duration_s": 10.0},
]
SLOS = {"m": 50.0}


def _arm(name: str, trickle_ms: float, burst_ms: float, violations: int) -> dict[str, Any]:
    timeline = [
        {"t": float(t), "p95_ms": trickle_ms if t < 10 else burst_ms, "offered": 10, "ok": 10}
        for t in range(20)
    ]
    overall = {
        "p95_ms": max(trickle_ms, burst_ms),
        "slo_violations": violations,
        "violation_fraction": violations / 200,
    }
    return {
        "arm": name,
        "overall": overall,
        "timeline": timeline,
        "timeline_bin_s": 1.0,
        "cpu": {"model_process_s": 0.0, "gateway_s": 10.0, "steal_share": 0.0},
    }


def test_the_expert_measured_twice_is_the_noise_floor_of_every_ratio() -> None:
    arms = {
        "expert": _arm("expert", 2.0, 8.0, 0),
        "oracle": _arm("oracle", 2.0, 8.0, 0),
        # The same knobs again: the burst's steady p95 half as high, three violations.
        REPEAT_ARM: _arm(REPEAT_ARM, 2.0, 4.0, 3),
        "agent": _arm("agent", 2.0, 8.0, 0)
        | {"cpu": {"model_process_s": 1.5, "gateway_s": 12.0, "steal_share": 0.1}},
    }
    figures = seed_summary(arms, PHASES, SLOS)
    floor = figures["noise_floor"]
    assert floor["steady_p95_ratio"] == 2.0  # 8 / 4: the larger way round
    assert floor["p95_ratio"] == 2.0
    assert floor["violations_ratio"] == 4.0  # (3 + 1) / (0 + 1)
    # The repeat never changes knobs, yet reads below the oracle in the burst: it settles at once.
    assert floor["settle_s"] == 0.0
    assert floor["gap_to_oracle_p95"] == -0.5
    assert figures["agent_cpu"] == {
        "model_process_s": 1.5,
        "gateway_s": 12.0,
        "gateway_s_vs_expert": 1.2,
        "steal_share": 0.1,
    }
    other = seed_summary({**arms, REPEAT_ARM: _arm(REPEAT_ARM, 2.0, 6.0, 1)}, PHASES, SLOS)
    summary = median_summary([figures, other, seed_summary(arms, PHASES, SLOS)])
    assert summary["noise_floor"]["steady_p95_ratio"] == 2.0
    assert summary["noise_floor"]["violations_ratio"] == 4.0


def test_the_repeat_is_scored_as_the_agent_and_the_oracle_bounds_the_reduction() -> None:
    arms = {
        "configured": _arm("configured", 4.0, 20.0, 0),
        "expert": _arm("expert", 2.0, 8.0, 0),
        "replay-best-1": _arm("replay-best-1", 2.0, 6.0, 0),
        "oracle": _arm("oracle", 2.0, 5.0, 0),
        REPEAT_ARM: _arm(REPEAT_ARM, 2.0, 10.0, 2),
        "agent": _arm("agent", 2.0, 8.0, 0),
    }
    figures = seed_summary(arms, PHASES, SLOS)
    assert figures["best_static_arm"] == "replay-best-1"
    assert figures["steady_p95_vs_best_static"] == round(8 / 6, 4)
    # The expert's knobs again, against the same best static arm: the burst 10 / 6, and
    # (2 + 1) / (0 + 1) violations; knobs that never change read this much.
    assert figures["noise_floor"]["repeat_steady_p95_vs_best_static"] == round(10 / 6, 4)
    assert figures["noise_floor"]["repeat_violations_vs_best_static"] == 3.0
    assert figures["p95_reduction_vs_default"] == 0.6  # 1 - 8 / 20
    assert figures["reachable"] == {
        "oracle_p95_reduction_vs_default": 0.75,
        "best_static_p95_reduction_vs_default": 0.7,
    }
    without = {k: v for k, v in arms.items() if k != "configured"}
    assert seed_summary(without, PHASES, SLOS)["reachable"] == {
        "oracle_p95_reduction_vs_default": None,
        "best_static_p95_reduction_vs_default": None,
    }
    summary = median_summary([figures, figures, seed_summary(without, PHASES, SLOS)])
    assert summary["reachable"]["oracle_p95_reduction_vs_default"] == 0.75
    assert summary["noise_floor"]["repeat_steady_p95_vs_best_static"] == round(10 / 6, 4)


def test_without_the_repeat_there_is_no_floor() -> None:
    arms = {"expert": _arm("expert", 2.0, 8.0, 0), "agent": _arm("agent", 2.0, 8.0, 0)}
    assert seed_summary(arms, PHASES, SLOS)["noise_floor"] is None
    assert median_summary([seed_summary(arms, PHASES, SLOS)])["noise_floor"] is None


def _burn(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_the_arm_meter_counts_the_loop_the_process_and_its_children_apart() -> None:
    meter = ArmMeter(os.getpid())
    child = multiprocessing.get_context("spawn").Process(target=_burn, args=(1.0,))
    child.start()
    busy = machine_busy_seconds()
    meter.start()
    _burn(0.3)
    time.sleep(0.05)
    while child.is_alive() and meter.stop()["model_process_s"] < 0.6:
        time.sleep(0.05)
    cpu = meter.stop()
    child.join(timeout=30)
    assert cpu["loop_s"] == pytest.approx(0.3, abs=0.1)  # this thread: the "loop"
    assert cpu["gateway_s"] >= cpu["loop_s"] - 0.02
    assert cpu["model_process_s"] >= 0.6  # the child, counted apart from the process
    assert cpu["gateway_s"] < 0.3 + 0.5  # the child's CPU is not the process's
    assert 0.0 <= cpu["steal_share"] <= 1.0
    # The machine's own count (/proc/stat) holds both processes' burning at least.
    machine = machine_cpu_seconds()
    assert busy is not None and machine is not None and set(machine) == set(PROC_STAT_FIELDS)
    assert sum(v for k, v in machine.items() if k not in ("idle", "iowait")) - busy >= 0.8
