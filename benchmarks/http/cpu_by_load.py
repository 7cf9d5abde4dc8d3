"""Experiment 7, what a request costs the gateway at each load, over HTTP and over MQTT.

One more gateway (``--no-tuner``, the repository's configured knobs, Mosquitto beside it)
serves both transports; ``sensor_mlp``, one row as Open Inference Protocol JSON, at

- **idle**: nothing sent, the gateway's CPU in cores;
- **a trickle**: Poisson arrivals at ``TRICKLE_RATE_PER_S`` from ``iotgw sim``'s virtual devices,
  the light load an edge box mostly sees;
- **one client**: a closed loop of one request at a time;
- **saturation**: a closed loop of ``SATURATION_IN_FLIGHT`` requests in flight.

A figure is the gateway process's user + system CPU (``/proc``: its event loop, its executor
threads, ONNX Runtime's) over the window, divided by the requests answered in it; the levels run
in turns, each over HTTP then over MQTT, every round, and the median over rounds is quoted. The
trickle's window is the simulator's whole run, its start-up (about a second, the gateway idle)
included; the idle figure says what that adds. The loads come from this machine's two cores
too, so the figures are the gateway's CPU, not its capacity.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

from benchmarks.common import Repeated, ServerProcess, process_cpu_seconds, python_argv
from benchmarks.http.bench import Bench
from benchmarks.http.codec_cpu import json_body
from benchmarks.http.workload import Model
from benchmarks.mqtt_clients import MqttJob, run_mqtt_load
from benchmarks.servers import HOST, clean_env, start_mosquitto, start_mqtt_gateway

MODEL = "sensor_mlp"
TRANSPORTS = ("http", "mqtt")
LEVELS = ("trickle", "one_client", "saturation")
TRICKLE_RATE_PER_S = 50.0
TRICKLE_DEVICES = 10
SATURATION_IN_FLIGHT = 32
QOS = 1  # what a device that wants its answer uses
TIMEOUT_S = 10.0


def cpu_by_load(
    bench: Bench, repo: Path, workdir: Path, models: dict[str, Model]
) -> dict[str, Any]:
    """The entry: per transport and level, CPU per answered request; the idle gateway's cores;
    the trickle and one client against saturation."""
    bench.log("CPU per request by load: idle, a trickle, one client, saturation; HTTP and MQTT")
    broker, port = start_mosquitto(workdir)
    bench.extra_servers.append(broker)
    gateway, base = start_mqtt_gateway(repo, workdir, port)
    bench.extra_servers.append(gateway)
    gateway.wait_for_log("MQTT: connected", bench.plan.startup_timeout_s)
    bench.config["cpu_by_load"] = {"argv": gateway.argv, "broker_port": port}
    model = models[MODEL]
    idle: list[float] = []
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        t: {level: [] for level in LEVELS} for t in TRANSPORTS
    }
    for round_ in range(bench.plan.headline_repeats):
        idle.append(_idle_cores(gateway, bench.plan.cpu_idle_s))
        for transport in TRANSPORTS:
            runs[transport]["trickle"].append(
                _trickle(
                    bench, transport, base, port, gateway, workdir / f"sim-{transport}{round_}"
                )
            )
        for level, in_flight in (("one_client", 1), ("saturation", SATURATION_IN_FLIGHT)):
            runs["http"][level].append(_http_closed_loop(bench, model, base, gateway, in_flight))
            runs["mqtt"][level].append(_mqtt_closed_loop(bench, model, port, gateway, in_flight))
    return _entry(bench, model, idle, runs)


def _idle_cores(gateway: ServerProcess, seconds: float) -> float:
    before, start = _cpu(gateway), time.perf_counter()
    time.sleep(seconds)
    return (_cpu(gateway) - before) / (time.perf_counter() - start)


def _cpu(gateway: ServerProcess) -> float:
    return _read(process_cpu_seconds(gateway.pid))


def _read(cpu: float | None) -> float:
    """A CPU reading of the gateway's; the experiment has no figure without one."""
    if cpu is None:
        raise RuntimeError("the gateway's CPU cannot be read from /proc")
    return cpu


def _trickle(
    bench: Bench, transport: str, base: str, port: int, gateway: ServerProcess, out: Path
) -> dict[str, Any]:
    """Poisson arrivals from the device simulator, its own process."""
    duration = bench.plan.cpu_trickle_s
    where = (
        ["--transport", "http"]
        if transport == "http"
        else ["--transport", "mqtt", "--broker", f"mqtt://{HOST}:{port}", "--qos", str(QOS)]
    )
    argv = python_argv(
        "gateway.cli",
        "sim",
        "run",
        "--arrival",
        "poisson",
        "--rate",
        f"{TRICKLE_RATE_PER_S:g}",
        "--duration",
        f"{duration:g}",
        *where,
        "--http-url",
        base,  # the HTTP devices' target, and where the simulator reads the model's metadata
        "--model",
        MODEL,
        "--devices",
        str(TRICKLE_DEVICES),
        "--framing",
        "json",
        "--seed",
        str(len(bench.runs)),
        "--timeout-s",
        f"{TIMEOUT_S:g}",
        "--out",
        str(out),
        "--no-plots",
        "--quiet",
    )
    before, start = _cpu(gateway), time.perf_counter()
    done = subprocess.run(
        argv, capture_output=True, text=True, env=clean_env(), timeout=duration + 120, check=False
    )
    wall = time.perf_counter() - start
    cpu = _cpu(gateway) - before
    if done.returncode != 0:
        raise RuntimeError(f"iotgw sim failed ({done.returncode}):\n{done.stderr[-3000:]}")
    requests = json.loads((out / "summary.json").read_text(encoding="utf-8"))["requests"]
    return _figure(cpu, requests["ok"], wall, lost=requests["lost"], sent=requests["sent"])


def _http_closed_loop(
    bench: Bench, model: Model, base: str, gateway: ServerProcess, in_flight: int
) -> dict[str, Any]:
    body = json_body(model)
    r = bench.load(
        url=model.url(base),
        model=model,
        concurrency=in_flight,
        setup=("raw", 0),
        duration_s=bench.plan.cpu_level_s,
        warmup_s=bench.plan.gw_warmup_s,
        server=gateway,
        body=(body, len(body)),
    )
    cores = _read(r["server_cpu_cores"])
    wall = r["client_wall_s"]
    return _figure(cores * wall, r["answered"], wall, lost=r.get("lost", 0), sent=None)


def _mqtt_closed_loop(
    bench: Bench, model: Model, port: int, gateway: ServerProcess, in_flight: int
) -> dict[str, Any]:
    job = MqttJob(
        port=port,
        topics=(f"iotgw/infer/{MODEL}/req",),
        client_id=f"bench-cpu-{len(bench.runs)}-{in_flight}-{time.monotonic_ns()}",
        qos=QOS,
        payload=json_body(model),
        concurrency=in_flight,
        duration_s=bench.plan.cpu_level_s,
        max_requests=bench.plan.max_requests_per_run,
        warmup_s=bench.plan.gw_warmup_s,
        timeout_s=TIMEOUT_S,
        watch=(("gateway", gateway.pid),),
    )
    out = run_mqtt_load(job)
    cores = _read(out["cpu"]["gateway"])
    wall = out["elapsed_s"]
    return _figure(cores * wall, out["answered"], wall, lost=out["lost"], sent=out["issued"])


def _figure(
    cpu_s: float, answered: int, wall_s: float, *, lost: int, sent: int | None
) -> dict[str, Any]:
    return {
        "answered": answered,
        "sent": sent,
        "lost": lost,
        "wall_s": round(wall_s, 3),
        "requests_per_s": round(answered / wall_s, 1) if wall_s > 0 else None,
        "gateway_cpu_s": round(cpu_s, 4),
        "cpu_us_per_request": round(cpu_s / answered * 1e6, 1) if answered else None,
    }


def _entry(
    bench: Bench,
    model: Model,
    idle: list[float],
    runs: dict[str, dict[str, list[dict[str, Any]]]],
) -> dict[str, Any]:
    per_request = {
        t: {level: _us(rs) for level, rs in by_level.items()} for t, by_level in runs.items()
    }
    entry: dict[str, Any] = {
        "figure": "cpu_by_load",
        "model": model.name,
        "request_encoding": "json",
        "knobs": "the repository's configured knobs (--no-tuner)",
        "trickle": f"Poisson at {TRICKLE_RATE_PER_S:g}/s from {TRICKLE_DEVICES} devices "
        "(iotgw sim)",
        "one_client": "a closed loop, 1 request in flight",
        "saturation": f"a closed loop, {SATURATION_IN_FLIGHT} requests in flight",
        "mqtt_qos": QOS,
        "idle_cores": Repeated.of(idle),
        "cpu_us_per_request": per_request,
        "lost": sum(r["lost"] for levels in runs.values() for rs in levels.values() for r in rs),
        "runs": runs,
    }
    for t in TRANSPORTS:
        sat = [r["cpu_us_per_request"] for r in runs[t]["saturation"]]
        for level in ("trickle", "one_client"):
            mine = [r["cpu_us_per_request"] for r in runs[t][level]]
            if all(v for v in (*sat, *mine)):
                # Round by round: a round's levels ran minutes apart at most.
                entry[f"{level}_vs_saturation_{t}"] = Repeated.of(
                    a / b for a, b in zip(mine, sat, strict=True)
                )
    bench.runs.append(entry)
    for t in TRANSPORTS:
        figures = ", ".join(
            f"{level} {us.median:.0f}" for level, us in per_request[t].items() if us is not None
        )
        bench.log(f"  {t}: gateway CPU per request (us): {figures}")
    bench.log(f"  idle: {entry['idle_cores'].median:.4f} cores")
    return entry


def _us(results: list[dict[str, Any]]) -> Repeated | None:
    values = [r["cpu_us_per_request"] for r in results]
    return Repeated.of(values) if values and all(v is not None for v in values) else None
