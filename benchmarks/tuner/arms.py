"""One arm: a fresh gateway process, its knobs (fixed, switched at phase boundaries, or left to
the online agent), and the seeded scenario replayed against it by ``iotgw sim``.

Arms:

- ``configured``: the model's ``config.toml`` knobs, tuner off;
- ``expert``: ``rrl.space.expert_default`` (eager batching, instances sized to the cores), tuner
  off;
- ``replay-best-1``, ``replay-best-2``: the two best static configurations of the trace replay
  (``rrl.replay``), tuner off; the best static configuration in hindsight is the best measured
  of every static arm;
- ``oracle``: each phase's best configuration of the replay, switched at the phase boundaries
  (``PUT .../knobs`` timed from the simulator's first progress line), tuner off;
- ``agent``: the online agent (``iotgw serve`` with its tuner, adaptive RRL), which starts from
  the expert default by itself.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import servers as http_bench
from benchmarks.common import ServerProcess, python_argv
from benchmarks.servers import admin_request as _http
from benchmarks.servers import clean_env as _clean_env
from benchmarks.servers import set_knobs
from benchmarks.tuner.scenarios import Phase, Scenario

STATIC_ARMS = ("configured", "expert", "replay-best-1", "replay-best-2")
ARMS = (*STATIC_ARMS, "oracle", "agent")
AGENT_ALGORITHM = "adaptive-rrl"  # what `iotgw serve` runs unless told otherwise
_FIRST_TICK = re.compile(r"^\[\s*1s\]")


@dataclass(frozen=True)
class Run:
    """What one sim run needs besides the scenario."""

    base: str
    phases: tuple[Phase, ...]
    seed: int
    slo_ms: float
    out: Path
    timeout_s: float = 10.0


def start_gateway(
    repo: Path, workdir: Path, model: str, *, agent: bool, log_name: str
) -> tuple[ServerProcess, str]:
    tuner = ["--tuner", AGENT_ALGORITHM, "--tune-models", model] if agent else ["--no-tuner"]
    return http_bench.start_gateway(repo, workdir, 120.0, tuner_args=tuner, log_name=log_name)


def write_scenario(phases: tuple[Phase, ...], path: Path) -> None:
    doc = {
        "phases": [
            {"name": p.name, "duration_s": p.duration_s, "process": "poisson", "rate": p.rate_per_s}
            for p in phases
        ]
    }
    path.write_text(json.dumps(doc), encoding="utf-8")


def sim_argv(scenario: Scenario, run: Run) -> list[str]:
    run.out.mkdir(parents=True, exist_ok=True)
    write_scenario(run.phases, run.out / "scenario.json")
    return python_argv(
        "gateway.cli",
        "sim",
        "run",
        "--transport",
        scenario.transport,
        "--http-url",
        run.base,
        "--model",
        scenario.model,
        "--scenario",
        str(run.out / "scenario.json"),
        "--devices",
        str(scenario.devices),
        "--seed",
        str(run.seed),
        "--timeout-s",
        str(run.timeout_s),
        "--framing",
        scenario.framing,
        "--slo-ms",
        str(run.slo_ms),
        "--out",
        str(run.out),
        "--no-plots",
    )


def run_sim(
    scenario: Scenario, run: Run, switches: list[tuple[float, dict[str, Any]]] | None = None
) -> dict[str, Any]:
    """Replay the scenario; ``switches`` (seconds from the start, knobs) are applied while it
    runs, timed from the simulator's first once-a-second progress line."""
    proc = subprocess.Popen(
        sim_argv(scenario, run),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=_clean_env(),
    )
    assert proc.stderr is not None
    tail: list[str] = []
    switcher: threading.Thread | None = None
    for line in proc.stderr:
        tail = [*tail[-50:], line]
        if switcher is None and switches and _FIRST_TICK.match(line):
            origin = time.monotonic() - 1.0
            switcher = threading.Thread(
                target=_switch, args=(run.base, scenario.model, origin, switches), daemon=True
            )
            switcher.start()
    code = proc.wait()
    if switcher is not None:
        switcher.join(timeout=120)
    if code != 0:
        raise RuntimeError(f"iotgw sim failed ({code}):\n{''.join(tail)[-4000:]}")
    return dict(json.loads((run.out / "summary.json").read_text(encoding="utf-8")))


def _switch(
    base: str, model: str, origin: float, switches: list[tuple[float, dict[str, Any]]]
) -> None:
    for at_s, knobs in switches:
        time.sleep(max(0.0, origin + at_s - time.monotonic()))
        for attempt in range(20):
            # Under overload the gateway may refuse a new connection (503, its connection cap):
            # the switch is retried, as an operator would.
            try:
                set_knobs(base, model, knobs)
                break
            except RuntimeError:
                if attempt == 19:
                    raise
                time.sleep(0.25)


def wait_for_agent_start(base: str, model: str, expected: dict[str, Any], timeout_s: float) -> None:
    """The agent applies its start configuration once its model is ready; the trace starts
    after that, as it would on a gateway that has been up for a while."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status, doc = _http("GET", f"{base}/admin/tuner/{model}?decisions=0")
        if status == 200 and doc.get("current") == expected:
            _, knobs = _http("GET", f"{base}/admin/models/{model}/knobs")
            if {k: knobs["knobs"][k] for k in expected} == expected:
                return
        time.sleep(0.2)
    raise RuntimeError(f"the agent did not start from {expected} within {timeout_s:g}s")


def figures(window: dict[str, Any]) -> dict[str, Any]:
    latency = window["latency_ms"] or {}
    slo = window["slo"] or {}
    requests = window["requests"]
    return {
        "requests": requests["planned"],
        "ok": requests["ok"],
        "lost": requests["lost"],
        "errors": requests["errors"],
        "offered_rps": window["offered_rps"],
        "achieved_rps": window["achieved_rps"],
        "p50_ms": latency.get("p50"),
        "p95_ms": latency.get("p95"),
        "p99_ms": latency.get("p99"),
        "slo_violations": slo.get("violations"),
        "violation_fraction": slo.get("violation_fraction"),
    }


def run_arm(
    arm: str,
    scenario: Scenario,
    run: Run,
    repo: Path,
    workdir: Path,
    *,
    knobs: dict[str, Any],
    switches: list[tuple[float, dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """One arm on a fresh gateway. ``knobs``: the start (for the agent: the configuration it is
    expected to start from by itself)."""
    agent = arm == "agent"
    server, base = start_gateway(
        repo, workdir, scenario.model, agent=agent, log_name=f"gateway-{run.out.name}.log"
    )
    try:
        if agent:
            wait_for_agent_start(base, scenario.model, knobs, timeout_s=90.0)
        else:
            set_knobs(base, scenario.model, knobs)
        summary = run_sim(scenario, Run(base, run.phases, run.seed, run.slo_ms, run.out), switches)
        tuner = _agent_state(base, scenario.model, run.out) if agent else None
        _, final = _http("GET", f"{base}/admin/models/{scenario.model}/knobs")
    finally:
        server.stop()
    return {
        "arm": arm,
        "seed": run.seed,
        "start_knobs": knobs,
        "switches": switches,
        "final_knobs": {k: final["knobs"][k] for k in knobs},
        "overall": figures(summary),
        "phases": {p["name"]: figures(p) for p in summary["phases"]},
        "timeline": [
            {"t": b["t"], "p95_ms": b["p95_ms"], "offered": b["offered"], "ok": b["ok"]}
            for b in summary["timeline"]
        ],
        "timeline_bin_s": summary["timeline_bin_s"],
        "send_lag_ms": summary["send_lag_ms"],
        "tuner": tuner,
    }


def _agent_state(base: str, model: str, out: Path) -> dict[str, Any]:
    _, state = _http("GET", f"{base}/admin/tuner/{model}?decisions=1000&estimates=5")
    # The whole decision log beside the simulator's outputs (kept with --keep).
    (out / "tuner_state.json").write_text(json.dumps(state, indent=1), encoding="utf-8")
    return {
        "decision_counts": state["decision_counts"],
        "final": state["current"],
        "best": state["best"],
        "workload_changes": [d["workload"] for d in state["decisions"] if d["kind"] == "workload"],
    }
