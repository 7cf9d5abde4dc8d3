"""``iotgw bench chaos``: the gateway and the broker killed, restarted and overloaded under QoS 1
load, every request accounted for on the device side.

Real processes on 127.0.0.1: Mosquitto (``persistence true``, its store in a temporary folder,
``set_tcp_nodelay true``, a large ``max_queued_messages``), ``iotgw serve`` gateways serving
``sensor_mlp`` (ONNX, from the demo repository), and device processes (``devices``) whose paho
clients keep persistent sessions and a ledger of every request id they published. Each id ends
as answered with 200, answered with an error (by reason), or lost: no reply by the end of a
settle period after the load (``settle_s``, ended early once every id has its reply).

- a: one gateway SIGKILLed twice and restarted with the same client id;
- b: the broker stopped with SIGTERM and started again on the same port and store;
- c: three replicas on one shared subscription, one SIGKILLed and one SIGTERMed, both back
  later (the third serves throughout);
- d: capacity measured by a closed-loop ramp, then three times it for ``overload_s``, on
  Mosquitto and on ``iotgw serve``'s embedded default broker (requests carry the model's SLO
  as their deadline, so the excess must be answered with 503s);
- e (``--soak`` only): a 30-minute run with the gateway's RSS read every 10 s;
- f: network partitions (``benchmarks.chaos.partition``): broker, replicas and devices on
  network namespaces of their own, one replica's link cut for longer than the broker's
  keep-alive timeout and restored, then the broker's link cut briefly (needs root); the full
  run repeats it with a short keep-alive and session expiry, so the cut member's session ends
  during the cut.

In cases a and c, gRPC clients (``grpc_clients``: one round-robin channel over every gateway's
gRPC port, gRPC's retry policy, ``wait_for_ready``) call the gateways beside the devices; their
calls are accounted the same way, under each case's ``grpc`` and in ``lost_grpc``.

``--cases d`` (any letters of a-d and f) runs those cases only and writes
``chaos_<cases>.json``.
Case d also records what the gateway itself saw (``gateway_side``: requests by outcome, its own
latency, queue and batch times from ``/metrics``) and the offered rate over the measured
capacity, so an admitted request's time can be placed inside or outside the gateway.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.chaos.devices import run_devices
from benchmarks.chaos.grpc_clients import run_grpc_clients
from benchmarks.chaos.partition import (
    FULL_PARTITION,
    FULL_SHORT_SESSION,
    QUICK_PARTITION,
    partition,
)
from benchmarks.chaos.report import account, print_table, summarize
from benchmarks.chaos.scenarios import (
    FULL,
    QUICK,
    Case,
    Load,
    Plan,
    broker_restart,
    gateway_kills,
    overload,
    replicas,
    request_body,
    soak,
)
from benchmarks.chaos.stack import MODEL, OVERLOAD_MODEL, demo_repository
from benchmarks.clients import ClientProcesses
from benchmarks.common import (
    load_average,
    machine_info,
    note_if_quick,
    source_commit,
    write_results,
)
from models.repository import read_config

DEVICE_PROCESSES = 2
GRPC_PROCESSES = 1


CASES = "abcdf"


def run(
    plan: Plan,
    *,
    quick: bool,
    soak_run: bool,
    out_dir: Path | None,
    cases_run: str = CASES,
    overload_model: str = OVERLOAD_MODEL,
) -> Path:
    machine = machine_info()
    code = source_commit()  # the checkout every gateway of the run starts from
    cases: list[Case] = []
    with tempfile.TemporaryDirectory(prefix="iotgw-bench-chaos-") as tmp:
        folder = Path(tmp)
        repo = demo_repository(folder)
        slo_ms = read_config(repo / MODEL / "1" / "config.toml").slo_ms
        with (
            ClientProcesses(DEVICE_PROCESSES, run_devices, name="chaos-devices") as clients,
            ClientProcesses(GRPC_PROCESSES, run_grpc_clients, name="chaos-grpc") as grpc_clients,
        ):
            load = _load(clients, plan, repo, MODEL, grpc_clients)
            chaos = (("a", gateway_kills), ("b", broker_restart), ("c", replicas))
            for letter, scenario in chaos:
                if letter in cases_run:
                    cases.append(_announce(scenario(load, repo, folder)))
            if "d" in cases_run:
                repo_d = demo_repository(folder, overload_model)
                flood = _load(clients, plan, repo_d, overload_model)
                for embedded in (False, True):
                    cases.append(_announce(overload(flood, repo_d, folder, embedded=embedded)))
            if "f" in cases_run:
                plans = (QUICK_PARTITION,) if quick else (FULL_PARTITION, FULL_SHORT_SESSION)
                for plan_f in plans:
                    cases.append(_announce(partition(load, repo, folder, plan_f)))
            if soak_run:
                cases.append(_announce(soak(load, repo, folder)))
    machine["load_average_at_end"] = load_average()
    config = {
        "code": code,
        "model": MODEL,
        "slo_ms": slo_ms,
        "overload_model": overload_model if "d" in cases_run else None,
        "plan": plan.__dict__,
        "soak": soak_run,
        "cases": cases_run,
    }
    return _report(cases, config, machine, quick=quick, out_dir=out_dir)


def _report(
    cases: list[Case],
    config: dict[str, Any],
    machine: dict[str, Any],
    *,
    quick: bool,
    out_dir: Path | None,
) -> Path:
    """Every case accounted for at the device, the table and the summary printed, and the
    results file written (a run of some cases only is kept apart: chaos.json holds every
    case); returns its path."""
    results = [account(case, config["slo_ms"]) for case in cases]
    print_table(results)
    summary = summarize(results)
    print(" ".join(f"{k}={v}" for k, v in summary.items()))
    note_if_quick(quick)
    cases_run = config["cases"]
    path = write_results(
        "chaos" if cases_run == CASES else f"chaos_{cases_run}",
        quick=quick,
        out_dir=out_dir,
        machine=machine,
        summary=summary,
        runs=results,
        config=config,
    )
    print(f"results: {path}")
    return path


def parse_cases(text: str) -> str:
    """``--cases``: letters of a-d and f, in order, each once."""
    cases = "".join(sorted(set(text)))
    if not cases or set(cases) - set(CASES):
        raise ValueError(f"--cases takes letters of {CASES!r}, got {text!r}")
    return cases


def _load(
    clients: ClientProcesses,
    plan: Plan,
    repo: Path,
    model: str,
    grpc_clients: ClientProcesses | None = None,
) -> Load:
    slo_ms = read_config(repo / model / "1" / "config.toml").slo_ms
    body = request_body(np.random.default_rng(0), model)
    return Load(clients, plan, body, slo_s=slo_ms / 1000.0, model=model, grpc_clients=grpc_clients)


def _announce(case: Case) -> Case:
    sent = sum(len(led["sent_at"]) for led in case.ledgers)
    print(f"{case.name}: {sent} requests sent", flush=True)
    return case


def main(
    quick: bool = False,
    out_dir: Path | None = None,
    soak: bool = False,
    cases: str = CASES,
    overload_model: str = OVERLOAD_MODEL,
) -> int:
    plan = QUICK if quick else FULL
    run(
        plan,
        quick=quick,
        soak_run=soak and not quick,
        out_dir=out_dir,
        cases_run=cases,
        overload_model=overload_model,
    )
    return 0


def cli(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.chaos", description=__doc__)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--soak", action="store_true", help="add the 30-minute soak (e)")
    p.add_argument("--out", type=Path)
    p.add_argument(
        "--cases",
        default=CASES,
        help="which of the cases a-d and f to run (e.g. 'd'); a subset writes chaos_<cases>.json",
    )
    p.add_argument(
        "--overload-model",
        default=OVERLOAD_MODEL,
        help="the demo model case d overloads (default: a model whose capacity is its compute)",
    )
    args = p.parse_args(argv)
    try:
        cases = parse_cases(args.cases)
    except ValueError as exc:
        p.error(str(exc))
    return main(
        quick=args.quick,
        out_dir=args.out,
        soak=args.soak,
        cases=cases,
        overload_model=args.overload_model,
    )
