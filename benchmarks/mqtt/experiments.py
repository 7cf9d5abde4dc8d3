"""The MQTT benchmark's two experiments, for QoS 0 and QoS 1:

- ``low_load``: one device, one request at a time, the echo and the gateway in turn request
  by request, so that whatever else the machine does meanwhile falls on both alike;
- ``saturation``: ``processes`` load clients with ``in_flight`` requests out each, against the
  echo and the gateway over MQTT, then against the gateway over HTTP with the same processes
  and concurrency (aiohttp, the headline; and the HTTP bench's raw client, the HTTP path's
  best case).
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from benchmarks.common import percentiles
from benchmarks.loadgen import LoadJob
from benchmarks.mqtt.plan import LOW_LOAD_KNOBS, MODEL, SATURATION_KNOBS, Plan, Request
from benchmarks.mqtt.stack import Stack
from benchmarks.mqtt_clients import MqttJob
from benchmarks.servers import set_knobs

SATURATION_BOUND = 1_000_000  # requests per run: the window, not the bound, ends a run


@dataclass(slots=True)
class Recorder:
    """Results by key (``low/<target>/qos<n>``, ``sat/<target>[/qos<n>]``), one per round, and
    every run as the results file lists it."""

    results: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    runs: list[dict[str, Any]] = field(default_factory=list)
    _names: Any = field(default_factory=itertools.count)

    def record(self, key: str, res: dict[str, Any], **fields: Any) -> None:
        self.results.setdefault(key, []).append(res)
        self.runs.append({**fields, **res})

    def client_id(self, what: str) -> str:
        return f"bench-{what}-{next(self._names)}"


def _budget(plan: Plan) -> float:
    return plan.timeout_s * 3 + 120


def low_load(stack: Stack, plan: Plan, req: Request, rec: Recorder) -> None:
    """No batching wait, one request at a time, echo and gateway in turn."""
    set_knobs(stack.url, MODEL, LOW_LOAD_KNOBS)
    for r in range(plan.runs):
        for qos in (0, 1):
            job = MqttJob(
                port=stack.port,
                topics=tuple(topic for topic, _ in stack.targets.values()),
                client_id=rec.client_id("low"),
                qos=qos,
                payload=req.frame,
                concurrency=1,
                duration_s=plan.timeout_s * 10,
                max_requests=plan.low_load_requests * len(stack.targets),
                warmup_s=plan.low_load_warmup_s,
                timeout_s=plan.timeout_s,
            )
            (out,) = stack.clients.run([job], _budget(plan) * 10)
            for i, target in enumerate(stack.targets):
                lat = out["latencies_by_topic_s"][i]
                res = {
                    "answered": len(lat),
                    "lost": out["lost_by_topic"][i],
                    "errors": out["errors"],  # the pair's (none expected)
                    **percentiles(np.array(lat) * 1e3),
                }
                key = f"low/{target}/qos{qos}"
                rec.record(key, res, phase="low_load", target=target, qos=qos, run=r)


def saturation(stack: Stack, plan: Plan, req: Request, rec: Recorder) -> None:
    """Batches fill up while a batch computes; every round: MQTT per QoS and target, then HTTP."""
    set_knobs(stack.url, MODEL, SATURATION_KNOBS)
    for r in range(plan.runs):
        for qos in (0, 1):
            for target in stack.targets:
                res = _mqtt_saturation(stack, plan, req, rec, target, qos)
                key = f"sat/{target}/qos{qos}"
                rec.record(key, res, phase="saturation", target=target, qos=qos, run=r)
        for client, key in (("aiohttp", "gateway-http"), ("raw", "gateway-http-raw")):
            res = _http_saturation(stack, plan, req, client)
            rec.record(f"sat/{key}", res, phase="saturation", target=key, run=r)


def _mqtt_saturation(
    stack: Stack, plan: Plan, req: Request, rec: Recorder, target: str, qos: int
) -> dict[str, Any]:
    topic, pid = stack.targets[target]
    start_at = time.time() + plan.saturation_warmup_s + 1.0
    jobs = [
        MqttJob(
            port=stack.port,
            topics=(topic,),
            client_id=rec.client_id(target),
            qos=qos,
            payload=req.frame,
            timeout_s=plan.timeout_s,
            watch=((target, pid), ("broker", stack.broker.pid)),
            concurrency=plan.in_flight,
            duration_s=plan.saturation_s,
            max_requests=SATURATION_BOUND,
            warmup_s=plan.saturation_warmup_s,
            start_at=start_at,
        )
        for _ in range(plan.processes)
    ]
    return merge_shares(stack.clients.run(jobs, _budget(plan)), "rps")


def _http_saturation(stack: Stack, plan: Plan, req: Request, client: str) -> dict[str, Any]:
    """The same processes and concurrency over HTTP; keep-alive connections, one per request
    in flight."""
    job = LoadJob(
        url=f"{stack.url}/v2/models/{MODEL}/infer",
        body=req.body,
        header_length=req.header_length,
        rows_per_request=1,
        concurrency=plan.in_flight,
        duration_s=plan.saturation_s,
        max_requests=SATURATION_BOUND,
        warmup_s=plan.saturation_warmup_s,
        timeout_s=plan.timeout_s,
        start_at=time.time() + plan.saturation_warmup_s + 1.0,
        server_pid=stack.gateway.pid,
        client=client,
    )
    return merge_shares(stack.clients.run([job] * plan.processes, _budget(plan)), "rows_per_s")


def merge_shares(results: Sequence[dict[str, Any]], rate_key: str) -> dict[str, Any]:
    """One figure from the shares of several client processes timed over the same window
    (MQTT clients' records, or the HTTP load generator's)."""
    errors: Counter[str] = Counter()
    for r in results:
        errors.update(r["errors"])
    latencies = np.array([x for r in results for x in r["latencies_s"]]) * 1e3
    return {
        "rps": sum(r[rate_key] for r in results),
        "answered": sum(r["answered"] for r in results),
        "answered_after_window": sum(r["answered_after_window"] for r in results),
        # The HTTP load generator counts a reply with an error status as lost too; here, as on
        # MQTT, lost means no answer at all, and error replies are counted apart.
        "lost": sum(r["lost"] for r in results)
        - sum(n for kind, n in errors.items() if kind.startswith("HTTP ")),
        "errors": dict(errors),
        "processes": len(results),
        **percentiles(latencies),
        "cpu_cores": _cpu_cores(results),
    }


def _cpu_cores(results: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """Cores used over the window by the servers, the clients together, and the rest of the
    machine (``others``)."""
    first = results[0]
    if "cpu" in first:
        cpu = dict(first["cpu"])  # process and machine readings: one window, one reading
    else:  # the HTTP load generator's record
        cpu = {"gateway": first["server_cpu_cores"], "machine": first["machine_busy_cores"]}
    wall = [r.get("client_wall_s") or r["elapsed_s"] for r in results]
    clients = [
        r["cpu"]["client"] if "cpu" in r else r["client_cpu_s"] / w
        for r, w in zip(results, wall, strict=True)
    ]
    cpu["clients"] = sum(c for c in clients if c is not None)
    cpu.pop("client", None)
    if cpu.get("machine") is not None:
        ours = sum(v for k, v in cpu.items() if k != "machine" and v is not None)
        cpu["others"] = max(0.0, cpu["machine"] - ours)
    return {k: (None if v is None else round(v, 3)) for k, v in cpu.items()}
