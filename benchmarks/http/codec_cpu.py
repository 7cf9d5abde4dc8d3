"""Experiment 6, the gateway's CPU per request before and after the fast codec and loop: two
``iotgw serve`` processes on the same repository, the same knobs and the same load, one on the
standard library's ``json`` and ``asyncio`` loop ("before"), one on orjson and uvloop
("after"), driven in turns (B A B A ...). A run's figure is the gateway process's user + system
CPU seconds (``/proc/<pid>/stat``: its event loop, its executor threads, ONNX Runtime's) over
the timed window, divided by the requests answered in it; the ratio is the median over rounds
of after / before. Both processes run all the while; the one not driven sits idle.

The workloads: ``sensor_mlp`` with one row as JSON both ways (the headline: protocol work is
nearly all of its cost), the same as the binary tensor framing (the loop alone: no JSON but
the header), and ``vision_cnn`` with one 28x28 row as JSON (784 numbers to parse, the
runtime's compute beside it). The JSON request carries ``Inference-Header-Content-Length``
equal to its length (the whole body is the JSON header), which the load generator's request
framing needs; the gateway reads it exactly as a plain JSON body.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import Repeated, ServerProcess
from benchmarks.http.bench import Bench
from benchmarks.http.figures import load_figure
from benchmarks.http.workload import Model
from benchmarks.servers import start_gateway

# (name, serve options): the configuration before issue 16's codec work, and after it.
CONFIGS: dict[str, tuple[str, ...]] = {
    "before": ("--event-loop", "asyncio", "--json-codec", "stdlib"),
    "after": ("--event-loop", "uvloop", "--json-codec", "orjson"),
}
# (workload name, model, request encoding); the first is the summary's headline.
WORKLOADS = (
    ("sensor_mlp_json", "sensor_mlp", "json"),
    ("sensor_mlp_binary", "sensor_mlp", "binary"),
    ("vision_cnn_json", "vision_cnn", "json"),
)
HEADLINE = WORKLOADS[0][0]
# The client: the raw one in this process (the cheapest per request, leaving the gateway the
# most of the shared cores), 8 requests in flight, enough to keep batches forming.
CONCURRENCY = 8
SETUP = ("raw", 0)


@dataclass(frozen=True, slots=True)
class _Request:
    model: Model
    body: bytes
    header_length: int


def json_body(model: Model) -> bytes:
    """One row as an Open Inference Protocol JSON request, as a device writes it."""
    doc = {
        "inputs": [
            {
                "name": model.input_name,
                "datatype": "FP32",
                "shape": list(model.row.shape),
                "data": model.row.ravel().tolist(),
            }
        ]
    }
    return json.dumps(doc).encode()


def _request(model: Model, encoding: str) -> _Request:
    if encoding == "binary":
        return _Request(model, model.body, model.header_length)
    body = json_body(model)
    return _Request(model, body, len(body))


def start_gateways(bench: Bench, repo: Path, workdir: Path) -> dict[str, tuple[ServerProcess, str]]:
    """The two gateways, each with its own log; the bench stops them on the way out."""
    servers: dict[str, tuple[ServerProcess, str]] = {}
    for name, options in CONFIGS.items():
        server, base = start_gateway(
            repo,
            workdir,
            bench.plan.startup_timeout_s,
            tuner_args=("--no-tuner", *options),
            log_name=f"gateway-{name}.log",
        )
        bench.extra_servers.append(server)
        servers[name] = (server, base)
    return servers


def cpu_per_request(
    bench: Bench, repo: Path, workdir: Path, models: dict[str, Model]
) -> dict[str, dict[str, Any]]:
    """Per workload, the entry with both configurations' figures and the ratio."""
    bench.log("CPU per request: json + asyncio (before) against orjson + uvloop (after)")
    servers = start_gateways(bench, repo, workdir)
    bench.config["cpu_per_request"] = {
        name: {"argv": server.argv} for name, (server, _) in servers.items()
    }
    out: dict[str, dict[str, Any]] = {}
    for name, model_name, encoding in WORKLOADS:
        req = _request(models[model_name], encoding)
        runs: dict[str, list[dict[str, Any]]] = {c: [] for c in CONFIGS}
        for _ in range(bench.plan.headline_repeats):
            for config, (server, base) in servers.items():
                runs[config].append(_run(bench, req, base, server))
        out[name] = _entry(bench, name, encoding, req, runs)
    return out


def _run(bench: Bench, req: _Request, base: str, server: ServerProcess) -> dict[str, Any]:
    plan = bench.plan
    r = bench.load(
        url=req.model.url(base),
        model=req.model,
        concurrency=CONCURRENCY,
        setup=SETUP,
        duration_s=plan.gw_headline_run_s,
        warmup_s=plan.gw_warmup_s,
        server=server,
        body=(req.body, req.header_length),
    )
    cores = r["server_cpu_cores"]
    # CPU seconds over the window / requests answered in it.
    r["server_cpu_per_request_s"] = (
        None if cores is None or not r["answered"] else cores * r["client_wall_s"] / r["answered"]
    )
    return r


def _entry(
    bench: Bench,
    name: str,
    encoding: str,
    req: _Request,
    runs: dict[str, list[dict[str, Any]]],
) -> dict[str, Any]:
    figures = {config: _figure(rs) for config, rs in runs.items()}
    entry: dict[str, Any] = {
        "figure": "cpu_per_request",
        "workload": name,
        "model": req.model.name,
        "request_encoding": encoding,
        "request_body_bytes": len(req.body),
        "rows_per_request": 1,
        "closed_loop_concurrency": CONCURRENCY,
        "client_kind": SETUP[0],
        "client_processes": SETUP[1],
        "configs": {config: " ".join(options) for config, options in CONFIGS.items()},
        **figures,
    }
    per_request = [
        [r["server_cpu_per_request_s"] for r in runs[config]] for config in ("before", "after")
    ]
    if all(v is not None for vs in per_request for v in vs):
        ratio = Repeated.of(a / b for b, a in zip(*per_request, strict=True))
        entry["cpu_per_request_ratio"] = ratio
        entry["ratio_how"] = "median over rounds of after / before, CPU s per answered request"
        rate = Repeated.of(
            a["answered"] / a["elapsed_s"] / (b["answered"] / b["elapsed_s"])
            for b, a in zip(runs["before"], runs["after"], strict=True)
        )
        entry["requests_per_s_ratio"] = rate
        bench.log(
            f"  {name}: {figures['before']['server_cpu_per_request_us'].median:.0f} -> "
            f"{figures['after']['server_cpu_per_request_us'].median:.0f} us of gateway CPU per "
            f"request: ratio {ratio.median:.3f}"
        )
    bench.runs.append(entry)
    return entry


def _figure(results: list[dict[str, Any]]) -> dict[str, Any]:
    fig = load_figure(results)
    per_request = [r["server_cpu_per_request_s"] for r in results]
    if all(v is not None for v in per_request):
        fig["server_cpu_per_request_us"] = Repeated.of(v * 1e6 for v in per_request)
    return fig
