"""One arm: a fresh gateway process (and, over MQTT, a fresh Mosquitto), its knobs (fixed,
switched at phase boundaries, or left to the online agent), and the seeded scenario replayed
against it by one ``iotgw sim`` per stream, all at once.

Arms (each a per-gateway configuration: one set of knobs per model):

- ``configured``: the models' ``config.toml`` knobs, tuner off;
- ``expert``: ``rrl.tuners.space.expert_default`` (eager batching, instances sized to the cores;
  with several models, to an equal share of them), tuner off;
- ``replay-best-1``, ``replay-best-2``: the two best static configurations of the trace replay
  (``benchmarks.tuner.replay``), tuner off; the best static configuration in hindsight is the
  best measured of every static arm;
- ``oracle``: each phase's best configuration of the replay, switched at the phase boundaries
  (``PUT .../knobs`` timed from the first simulator's first progress line), tuner off;
- ``agent``: the online agent (``iotgw serve`` with its tuner, adaptive RRL), which starts from
  the expert default by itself;
- ``expert-again``: the expert arm run again after all the others, tuner off: how far apart the
  same knobs measure on the same trace (``report.noise_floor``).

Each arm records what it cost (``cpu``): the gateway's event loop and process, the agent's model
process, and the share of the machine the hypervisor took meanwhile.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import servers as http_bench
from benchmarks.common import python_argv
from benchmarks.servers import HOST, set_knobs, start_mosquitto
from benchmarks.servers import admin_request as _http
from benchmarks.servers import clean_env as _clean_env
from benchmarks.tuner.cpu import ArmMeter
from benchmarks.tuner.scenarios import Phase, Scenario

STATIC_ARMS = ("configured", "expert", "replay-best-1", "replay-best-2")
REPEAT_ARM = "expert-again"
"""The expert default once more, last: not a candidate for the best static configuration, but
the same knobs measured twice in one seed, the noise floor of every comparison between arms."""
ARMS = (*STATIC_ARMS, "oracle", "agent", REPEAT_ARM)
AGENT_ALGORITHM = "adaptive-rrl"  # what `iotgw serve` runs unless told otherwise
_FIRST_TICK = re.compile(r"^\[\s*1s\]")
Knobs = dict[str, Any]
Switches = list[tuple[float, dict[str, Knobs]]]
"""(seconds from the trace's start, knobs per model)."""


@dataclass(frozen=True)
class Target:
    """Where the devices send: the gateway's HTTP base, and the broker over MQTT."""

    base: str
    broker: str | None = None
    pid: int | None = None
    """The gateway process (its main thread runs the event loop)."""
    broker_pid: int | None = None


@dataclass(frozen=True)
class Load:
    """One stream's simulator run."""

    model: str
    phases: tuple[Phase, ...]
    seed: int
    slo_ms: float
    out: Path
    timeout_s: float = 10.0


def stream_seed(seed: int, index: int) -> int:
    """Each stream its own arrivals: the first stream the seed itself (the single-model
    scenarios replay what they always did)."""
    return seed + 1000 * index


@contextlib.contextmanager
def gateway(
    scenario: Scenario, repo: Path, workdir: Path, *, agent: bool, log_name: str
) -> Iterator[Target]:
    """A fresh gateway for the scenario's models (and Mosquitto over MQTT), stopped on exit."""
    tuner = (
        ["--tuner", AGENT_ALGORITHM, "--tune-models", ",".join(scenario.models)]
        if agent
        else ["--no-tuner"]
    )
    if scenario.transport == "http":
        server, base = http_bench.start_gateway(
            repo, workdir, 120.0, tuner_args=tuner, log_name=log_name
        )
        with server:
            yield Target(base, pid=server.pid)
        return
    folder = workdir / log_name.removesuffix(".log")
    folder.mkdir(parents=True, exist_ok=True)
    broker, port = start_mosquitto(folder)
    with broker:
        server, base = http_bench.start_gateway(
            repo,
            folder,
            120.0,
            tuner_args=tuner,
            broker=f"mqtt://{HOST}:{port}",
            client_id="bench-tuner-gateway",
        )
        with server:
            yield Target(base, f"mqtt://{HOST}:{port}", server.pid, broker.pid)


def write_scenario(phases: tuple[Phase, ...], path: Path) -> None:
    doc = {
        "phases": [
            {"name": p.name, "duration_s": p.duration_s, "process": "poisson", "rate": p.rate_per_s}
            for p in phases
        ]
    }
    path.write_text(json.dumps(doc), encoding="utf-8")


def sim_argv(scenario: Scenario, target: Target, load: Load) -> list[str]:
    load.out.mkdir(parents=True, exist_ok=True)
    write_scenario(load.phases, load.out / "scenario.json")
    where = ["--transport", "http"]
    if target.broker is not None:
        where = ["--transport", "mqtt5", "--broker", target.broker, "--qos", "1"]
    return python_argv(
        "gateway.cli",
        "sim",
        "run",
        *where,
        "--http-url",
        target.base,
        "--model",
        load.model,
        "--scenario",
        str(load.out / "scenario.json"),
        "--devices",
        str(scenario.devices),
        "--device-prefix",
        f"{load.model}-d",
        "--seed",
        str(load.seed),
        "--timeout-s",
        str(load.timeout_s),
        "--framing",
        scenario.framing,
        "--slo-ms",
        str(load.slo_ms),
        "--out",
        str(load.out),
        "--no-plots",
    )


def run_sims(
    scenario: Scenario, target: Target, loads: list[Load], switches: Switches | None = None
) -> list[dict[str, Any]]:
    """Replay every stream at once, one simulator each; ``switches`` are applied while they
    run, timed from the first simulator's first once-a-second progress line. Returns each
    simulator's summary."""
    procs = [
        subprocess.Popen(
            sim_argv(scenario, target, load),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=_clean_env(),
        )
        for load in loads
    ]
    tails: list[list[str]] = [[] for _ in procs]
    readers = [
        threading.Thread(target=_drain, args=(p, tails[i]), daemon=True)
        for i, p in enumerate(procs[1:], start=1)
    ]
    for r in readers:
        r.start()
    switcher: threading.Thread | None = None
    assert procs[0].stderr is not None
    for line in procs[0].stderr:
        tails[0] = [*tails[0][-50:], line]
        if switcher is None and switches and _FIRST_TICK.match(line):
            origin = time.monotonic() - 1.0
            switcher = threading.Thread(
                target=_switch, args=(target.base, origin, switches), daemon=True
            )
            switcher.start()
    codes = [p.wait() for p in procs]
    for r in readers:
        r.join(timeout=10)
    if switcher is not None:
        switcher.join(timeout=120)
    for code, tail in zip(codes, tails, strict=True):
        if code != 0:
            raise RuntimeError(f"iotgw sim failed ({code}):\n{''.join(tail)[-4000:]}")
    return [
        dict(json.loads((load.out / "summary.json").read_text(encoding="utf-8"))) for load in loads
    ]


def _drain(proc: subprocess.Popen[str], tail: list[str]) -> None:
    """Read a simulator's progress lines (a full pipe would stall it), keeping the last."""
    assert proc.stderr is not None
    for line in proc.stderr:
        tail.append(line)
        del tail[:-50]


def _switch(base: str, origin: float, switches: Switches) -> None:
    for at_s, per_model in switches:
        time.sleep(max(0.0, origin + at_s - time.monotonic()))
        for model, knobs in per_model.items():
            for attempt in range(20):
                # Under overload the gateway may refuse a new connection (503, its connection
                # cap): the switch is retried, as an operator would.
                try:
                    set_knobs(base, model, knobs)
                    break
                except RuntimeError:
                    if attempt == 19:
                        raise
                    time.sleep(0.25)


def wait_for_agent_start(base: str, expected: dict[str, Knobs], timeout_s: float) -> None:
    """Each agent applies its start configuration once its model is ready; the trace starts
    after that, as it would on a gateway that has been up for a while."""
    deadline = time.monotonic() + timeout_s
    waiting = dict(expected)
    while waiting and time.monotonic() < deadline:
        for model, knobs in list(waiting.items()):
            status, doc = _http("GET", f"{base}/admin/tuner/{model}?decisions=0")
            if status == 200 and doc.get("current") == knobs:
                _, now = _http("GET", f"{base}/admin/models/{model}/knobs")
                if {k: now["knobs"][k] for k in knobs} == knobs:
                    del waiting[model]
        time.sleep(0.2)
    if waiting:
        raise RuntimeError(f"the agents did not start from {waiting} within {timeout_s:g}s")


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
    loads: list[Load],
    repo: Path,
    workdir: Path,
    *,
    knobs: dict[str, Knobs],
    switches: Switches | None = None,
) -> dict[str, Any]:
    """One arm on a fresh gateway. ``knobs``: per model, the start (for the agent: the
    configuration it is expected to start from by itself)."""
    agent = arm == "agent"
    name = loads[0].out.name
    with gateway(scenario, repo, workdir, agent=agent, log_name=f"gateway-{name}.log") as target:
        if agent:
            wait_for_agent_start(target.base, knobs, timeout_s=90.0)
        else:
            for model, k in knobs.items():
                set_knobs(target.base, model, k)
        meter = ArmMeter(target.pid) if target.pid is not None else None
        if meter is not None:
            meter.start()
        summaries = run_sims(scenario, target, loads, switches)
        cpu = None if meter is None else meter.stop()
        tuner = (
            {
                m: _agent_state(target.base, m, load.out)
                for m, load in zip(knobs, loads, strict=True)
            }
            if agent
            else None
        )
        final = {m: _http("GET", f"{target.base}/admin/models/{m}/knobs")[1] for m in knobs}
    streams = {
        load.model: {
            "start_knobs": knobs[load.model],
            "final_knobs": {k: final[load.model]["knobs"][k] for k in knobs[load.model]},
            **_stream_figures(summary),
        }
        for load, summary in zip(loads, summaries, strict=True)
    }
    result: dict[str, Any] = {
        "arm": arm,
        "seed": loads[0].seed,
        "switches": switches,
        "cpu": cpu,
    }
    if len(streams) == 1:  # one model: its figures at the top, as every earlier results file
        result.update(next(iter(streams.values())))
        result["tuner"] = None if tuner is None else next(iter(tuner.values()))
    else:
        result["streams"] = streams
        result["tuner"] = tuner
    return result


def _stream_figures(summary: dict[str, Any]) -> dict[str, Any]:
    return {
        "overall": figures(summary),
        "phases": {p["name"]: figures(p) for p in summary["phases"]},
        "timeline": [
            {"t": b["t"], "p95_ms": b["p95_ms"], "offered": b["offered"], "ok": b["ok"]}
            for b in summary["timeline"]
        ],
        "timeline_bin_s": summary["timeline_bin_s"],
        "send_lag_ms": summary["send_lag_ms"],
    }


def _agent_state(base: str, model: str, out: Path) -> dict[str, Any]:
    _, state = _http("GET", f"{base}/admin/tuner/{model}?decisions=1000&estimates=5")
    # The whole decision log beside the simulator's outputs (kept with --keep).
    (out / "tuner_state.json").write_text(json.dumps(state, indent=1), encoding="utf-8")
    return {
        "decision_counts": state["decision_counts"],
        "final": state["current"],
        "best": state["best"],
        "queue_model": state["queue_model"],
        "workload_changes": [d["workload"] for d in state["decisions"] if d["kind"] == "workload"],
    }
