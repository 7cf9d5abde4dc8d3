"""How much the peers benchmark measures (``FULL`` for the committed figures, ``QUICK`` for CI),
the batching both servers get, and the targets the summary is held against."""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.common import MIN_FULL_RUNS

NAME = "peers"
MODELS = ("vision_cnn", "sensor_mlp")
# Adaptive batching for both servers, the gateway's ``--no-tuner`` arm: up to 32 per batch, a
# batch waits at most 2 ms to fill. (The gateway counts rows, MLServer counts requests: the
# same at one row per request; at eight rows MLServer may build batches of up to 256 rows.)
MAX_BATCH_SIZE = 32
BATCH_TIMEOUT_MS = 2.0

# The time budget every request carries (OIP ``timeout`` parameter, microseconds): without it
# the gateway refuses at once (503 "deadline") a request it predicts would miss its model's SLO
# (vision_cnn 250 ms), which 128 clients of 8 images each always would on two cores, while
# MLServer, which has no deadlines, answers everything late. With it both serve every request,
# so the figures compare serving, not admission policies. MLServer ignores the parameter.
REQUEST_BUDGET_S = 20.0

# The arms, in the order of the first round (later rounds rotate it): MLServer and the
# gateway on the same JSON body, and the gateway on the binary tensor extension beside them.
MLSERVER = "mlserver_json"
GATEWAY = "gateway_json"
GATEWAY_BINARY = "gateway_binary"
ARMS = (MLSERVER, GATEWAY, GATEWAY_BINARY)

# Issue 16's targets for the gateway against MLServer (JSON, one row per request).
TARGETS = {
    "vs_mlserver_throughput_ratio_c32": (">=", 1.5),
    "vs_mlserver_p99_ratio_c32": ("<=", 1.0),
    "vs_mlserver_p50_ratio_c1": ("<=", 0.8),
}


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
    # Quick mode (CI) skips the MLServer arm with its reason when MLServer cannot be installed;
    # a full run without the peer it is about fails instead.
    mlserver_optional: bool


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
    mlserver_optional=False,
)
QUICK = Plan(
    quick=True,
    repeats=1,
    rows_per_request=(1, 8),
    concurrency=(1, 32),
    run_s=0.3,
    warmup_s=0.1,
    max_run_s=1.0,
    max_requests_per_run=20_000,
    client_timeout_s=20.0,
    startup_timeout_s=90.0,
    mlserver_optional=True,
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
