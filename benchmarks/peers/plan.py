"""How much the peers benchmark measures (``FULL`` for the committed figures, ``QUICK`` for CI),
the batching every server gets, and the targets the summary is held against."""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.common import MIN_FULL_RUNS
from models.knobs import Knobs

NAME = "peers"
MODELS = ("vision_cnn", "sensor_mlp")

# The time budget every request carries (OIP ``timeout`` parameter, microseconds): without it
# the gateway refuses at once (503 "deadline") a request it predicts would miss its model's SLO
# (vision_cnn 250 ms), which 128 clients of 8 images each always would on two cores, while
# MLServer, which has no deadlines, answers everything late. With it both serve every request,
# so the figures compare serving, not admission policies. MLServer ignores the parameter;
# Triton would hold a request to it only under a queue policy, and none is set.
REQUEST_BUDGET_S = 20.0

# The best static configuration per model, which the ``--no-tuner`` gateway arm, Triton and
# MLServer all get (maximum batch, queue delay, instances, intra- and inter-op threads):
# vision_cnn's is the best static of ``iotgw bench find`` at 32 connections
# (``results/tuner_find_vision_cnn_c32_statics.json``: batch 32, no wait, 2 instances x 1
# thread); sensor_mlp's is ``iotgw bench http``'s saturation choice (``results/http.json``,
# ``config.gateway_saturation_knobs``: batch 64, 1 ms, 2 x 1).
STATIC_KNOBS = {
    "vision_cnn": Knobs(32, 0.0, 2, 1, 1),
    "sensor_mlp": Knobs(64, 1.0, 2, 1, 1),
}

# The arms, in the order of the first round (later rounds rotate it): the two peers and the
# gateway on the same JSON body (the default ``iotgw serve``, agent on: the arm that counts;
# ``--no-tuner`` with the best static configuration beside it), and the static gateway on the
# binary tensor extension.
MLSERVER = "mlserver_json"
TRITON = "triton_json"
GATEWAY = "gateway_json"
GATEWAY_STATIC = "gateway_static_json"
GATEWAY_BINARY = "gateway_binary"
ARMS = (MLSERVER, TRITON, GATEWAY, GATEWAY_STATIC, GATEWAY_BINARY)
PEERS = (MLSERVER, TRITON)
JSON_ARMS = (MLSERVER, TRITON, GATEWAY, GATEWAY_STATIC)  # what wrk and the open loop drive
# Over gRPC (``grpc_points``): Triton's endpoint and the same two gateways'.
TRITON_GRPC = "triton_grpc"
GATEWAY_GRPC = "gateway_grpc"
GATEWAY_STATIC_GRPC = "gateway_static_grpc"
GRPC_ARMS = (TRITON_GRPC, GATEWAY_GRPC, GATEWAY_STATIC_GRPC)

# Issue 16's targets for the gateway against MLServer (JSON, one row per request).
TARGETS = {
    "vs_mlserver_throughput_ratio_c32": (">=", 1.5),
    "vs_mlserver_p99_ratio_c32": ("<=", 1.0),
    "vs_mlserver_p50_ratio_c1": ("<=", 0.8),
}
# Issue 37's targets for the gateway (agent on) against Triton: closed loops through wrk, the
# open loop's capacity at the model's SLO.
TRITON_TARGETS = {
    "vs_triton_throughput_ratio_c8": (">=", 1.2),
    "vs_triton_throughput_ratio_c32": (">=", 1.2),
    "vs_triton_throughput_ratio_c128": (">=", 1.2),
    "vs_triton_p99_ratio_c32": ("<=", 1.0),
    "vs_triton_p50_ratio_c1": ("<=", 0.5),
    "vs_triton_capacity_ratio": (">=", 1.25),
}

# Issue 33's target for the gateway's gRPC (agent on) against Triton's gRPC, h2load at 32 calls.
GRPC_TARGETS = {"grpc_vs_triton_grpc_throughput_ratio_c32": (">=", 1.0)}


@dataclass(frozen=True, slots=True)
class Plan:
    quick: bool
    repeats: int  # rounds: every arm once per round at every point
    rows_per_request: tuple[int, ...]
    concurrency: tuple[int, ...]
    run_s: float  # timed window of one run, at least
    warmup_s: float  # before every run, on the same connections, at least
    max_run_s: float
    max_requests_per_run: int
    client_timeout_s: float
    startup_timeout_s: float
    # Quick mode (CI) skips a peer's arm with its reason when the peer cannot be installed; a
    # full run without the peers it is about fails instead.
    peers_optional: bool
    wrk_concurrency: tuple[int, ...]  # closed loops through wrk, one row per request
    wrk_s: float  # timed window of one wrk (or h2load) run, after a warm-up of ``wrk_warmup_s``
    wrk_warmup_s: float
    grpc_concurrency: tuple[int, ...]  # closed loops over gRPC through h2load, calls in flight
    capacity_repeats: int  # capacity searches per arm (two or more give the noise floor)
    open_s: float  # one open-loop step, after a warm-up of ``open_warmup_s`` on the first
    open_warmup_s: float
    max_open_steps: int  # rates tried per capacity search, at most


FULL = Plan(
    quick=False,
    repeats=MIN_FULL_RUNS,
    rows_per_request=(1, 8),
    concurrency=(1, 8, 32, 128),
    run_s=1.5,
    warmup_s=0.3,
    max_run_s=6.0,
    max_requests_per_run=200_000,
    client_timeout_s=20.0,
    startup_timeout_s=180.0,
    peers_optional=False,
    wrk_concurrency=(1, 8, 32, 128),
    grpc_concurrency=(1, 8, 32, 128),
    wrk_s=5.0,
    wrk_warmup_s=1.0,
    capacity_repeats=2,
    open_s=5.0,
    open_warmup_s=2.0,
    max_open_steps=10,
)
QUICK = Plan(
    quick=True,
    repeats=1,
    rows_per_request=(1,),
    concurrency=(1, 32),
    run_s=0.3,
    warmup_s=0.1,
    max_run_s=1.0,
    max_requests_per_run=20_000,
    client_timeout_s=20.0,
    startup_timeout_s=90.0,
    peers_optional=True,
    wrk_concurrency=(1, 32),
    grpc_concurrency=(1, 32),
    wrk_s=1.0,
    wrk_warmup_s=0.5,
    capacity_repeats=1,
    open_s=1.0,
    open_warmup_s=0.5,
    max_open_steps=2,
)


def windows(plan: Plan, cycle_s: float | None) -> tuple[float, float]:
    """(warm-up, timed window) of one run whose clients wait about ``cycle_s`` for each reply
    (Little's law: clients x rows per request / rows per second; None: not known yet).

    The load generator's warm-up ends when every client has its last reply, so the timed window
    always starts with no request in flight; a warm-up only warms connections and code paths,
    and where replies take longer than the warm-up itself it would mostly wait for them: it is
    left out there (the servers are warm from the points before). The timed window holds 4
    replies per client, within the plan's bounds; each run also waits out the replies in flight
    when its window closes (about one cycle)."""
    if cycle_s is None:
        return plan.warmup_s, plan.run_s
    warm = plan.warmup_s if cycle_s <= plan.warmup_s else 0.0
    return warm, min(max(plan.run_s, 4.0 * cycle_s), plan.max_run_s)
