"""The closed loops of the peers benchmark over gRPC: the gateway's gRPC endpoint (the default
``iotgw serve``, and ``--no-tuner`` with the best static configuration) against Triton's, the
same serialized ``ModelInferRequest`` (KServe's ``inference.GRPCInferenceService``, which both
implement) to each, one row per request, through h2load (``benchmarks.h2load``, a C client),
the arms interleaved round by round as in ``wrk_points`` and the ratios taken within rounds.

h2load cannot read a gRPC status, so every run also reads the server's own count of successful
inferences from its Prometheus metrics (the gateway's ``iotgw_requests_total`` over gRPC with
outcome ok; Triton's ``nv_inference_request_success``: PyTriton restricts Triton's statistics
extension to a token it keeps): a call h2load saw answered that the server did not count as a
success is failed. Before anything is timed, one call to every arm is checked against the
runtime."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.common import ServerProcess
from benchmarks.h2load import run_h2load
from benchmarks.http.workload import TOLERANCE, Model
from benchmarks.peers.measure import (
    interleaved_point,
    with_server_cores,
)
from benchmarks.peers.plan import REQUEST_BUDGET_S, TRITON_GRPC, Plan

METHOD = "/inference.GRPCInferenceService/ModelInfer"
_GRPC_LISTENING = r"gRPC listening on grpc://([^:\s]+):(\d+)"


@dataclass(frozen=True, slots=True)
class SuccessCounter:
    """Where a server counts the inferences it served: a Prometheus sample and its labels."""

    metrics_url: str
    sample: str
    labels: dict[str, str]
    """Labels the samples counted must carry, besides ``model``."""


GATEWAY_COUNTER: tuple[str, dict[str, str]] = (
    "iotgw_requests_total",
    {"transport": "grpc", "outcome": "ok"},
)
# Triton exposes ``nv_inference_request_success`` (a counter without the suffix); the parser
# names every counter's samples ``<name>_total``.
TRITON_COUNTER: tuple[str, dict[str, str]] = ("nv_inference_request_success_total", {})


@dataclass(frozen=True, slots=True)
class GrpcArm:
    name: str
    target: str
    """The gRPC endpoint, ``host:port`` (plaintext)."""
    counter: SuccessCounter
    server: ServerProcess


def gateway_target(server: ServerProcess) -> str:
    """The gRPC endpoint a gateway started with ``--grpc-port 0`` logged."""
    found = server.wait_for_log(_GRPC_LISTENING, 30.0)
    return f"{found[1]}:{found[2]}"


def infer_message(model: Model) -> bytes:
    """One row (the peers' JSON body's rows) as a serialized ``ModelInferRequest``: the tensor in
    ``raw_input_contents``, the benchmark's time budget as the ``timeout`` parameter."""
    from gateway.grpc.messages import message

    row = np.ascontiguousarray(model.inputs(1, seed=42)[model.input_name], dtype="<f4")
    request = message("inference.ModelInferRequest")(model_name=model.name, model_version="1")
    request.parameters["timeout"].int64_param = int(REQUEST_BUDGET_S * 1e6)
    request.inputs.add(name=model.input_name, datatype="FP32", shape=list(row.shape))
    request.raw_input_contents.append(row.tobytes())
    return bytes(request.SerializeToString())


def reply_difference(arm: GrpcArm, model: Model) -> float:
    """Largest absolute difference between ``arm``'s gRPC reply to ``infer_message`` and the
    runtime called in this process on the same row; raises when the reply is wrong."""
    from gateway.grpc.messages import message
    from models.backends import load_runtime
    from models.runtime import Threads

    response_type = message("inference.ModelInferResponse")
    with grpc.insecure_channel(arm.target) as channel:
        call: grpc.UnaryUnaryMultiCallable[bytes, Any] = channel.unary_unary(
            METHOD, response_deserializer=response_type.FromString
        )
        reply = call(infer_message(model), timeout=60)
    rows = model.inputs(1, seed=42)[model.input_name]
    runtime = load_runtime(model.version, Threads(1, 1))
    want = runtime.infer({model.input_name: rows})
    runtime.close()
    got = {
        out.name: np.frombuffer(raw, dtype="<f4").reshape(tuple(out.shape))
        for out, raw in zip(reply.outputs, reply.raw_output_contents, strict=True)
    }
    worst = 0.0
    for name in model.output_names:
        if got[name].shape != want[name].shape:
            raise AssertionError(
                f"{arm.name}: {name} shape {got[name].shape} != {want[name].shape}"
            )
        worst = max(worst, float(np.max(np.abs(got[name] - want[name]))))
    if worst > TOLERANCE:
        raise AssertionError(f"{arm.name}: the gRPC reply differs from the runtime's by {worst}")
    return worst


def served(arm: GrpcArm, model: Model) -> int:
    """Successful inferences of ``model`` the server has counted (every version)."""
    c = arm.counter
    with urllib.request.urlopen(c.metrics_url, timeout=10) as reply:
        text = reply.read().decode()
    return counted(text, c.sample, {**c.labels, "model": model.name})


def counted(metrics_text: str, sample: str, labels: dict[str, str]) -> int:
    """The sum of the Prometheus ``sample``s in ``metrics_text`` that carry ``labels``."""
    return round(
        sum(
            s.value
            for family in text_string_to_metric_families(metrics_text)
            for s in family.samples
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())
        )
    )


def grpc_run(plan: Plan, arm: GrpcArm, model: Model, message: bytes, calls: int) -> dict[str, Any]:
    """A warm-up on fresh connections, then the timed run: what h2load saw, what the server
    counted as served, and the server's CPU (its process tree) over the timed run."""
    timeout_s = plan.client_timeout_s
    run_h2load(
        arm.target, METHOD, message, calls=calls, seconds=plan.wrk_warmup_s, timeout_s=timeout_s
    )
    before = served(arm, model)
    res, server_cores = with_server_cores(
        arm.server.pid,
        lambda: run_h2load(
            arm.target, METHOD, message, calls=calls, seconds=plan.wrk_s, timeout_s=timeout_s
        ),
    )
    # Calls answered in the run's last instants may be counted by the server after h2load
    # stopped timing; fewer counted than answered means failed calls.
    confirmed = served(arm, model) - before
    unconfirmed = max(0, res.done - confirmed)
    answered = res.done - unconfirmed
    rate = answered / res.seconds if res.seconds > 0 else 0.0
    return {
        **res.as_dict(),
        "served_by_server": confirmed,
        "failed": res.failed + unconfirmed,
        "requests_per_s": rate,
        "server_cpu_cores": server_cores,
        "server_cpu_ms_per_request": 1000.0 * server_cores / rate if rate else None,
    }


def grpc_point(
    plan: Plan,
    arms: Sequence[GrpcArm],
    model: Model,
    calls: int,
    record: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    """Every arm ``plan.repeats`` times at ``calls`` in flight, interleaved; each run handed to
    ``record``. Returns the point: per arm the medians and floors, the ratios to Triton's."""
    message = infer_message(model)
    return interleaved_point(
        plan,
        arms,
        {"model": model.name, "connections": calls},
        "peer_grpc",
        lambda arm: grpc_run(plan, arm, model, message, calls),
        record,
        peers=(TRITON_GRPC,),
    )
