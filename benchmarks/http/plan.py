"""How much the HTTP benchmark measures (``FULL`` for the committed figures, ``QUICK`` for CI),
the rules it chooses knobs and loads by, and the load generator setups it compares."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from benchmarks.common import MIN_FULL_RUNS, usable_cores

NAME = "http"
MODELS = ("sensor_mlp", "vision_cnn")
LOW_LOAD_MODEL = "sensor_mlp"
# One batch may cost at most this fraction of the model's SLO in the gateway: the rest is
# left for waiting behind the batch ahead and for the batch to fill.
BATCH_SLO_FRACTION = 0.25
# Little's law cap on the closed loop: N in flight at X rows/s wait N/X; keep it under half the SLO.
CLOSED_LOOP_SLO_FRACTION = 0.5
MAX_CLOSED_LOOP = 128


# A load generator setup: (client kind, processes); kind "aiohttp" or "raw" (RawHttpConnection);
# 0 processes: the client runs in the benchmark process itself.
Setup = tuple[str, int]
# The cheapest client, so that the knob comparison leaves the gateway the most CPU.
KNOB_SWEEP_SETUP: Setup = ("raw", 0)


def setup_fields(setup: Setup) -> dict[str, Any]:
    """A setup as the results file names it."""
    kind, processes = setup
    what = {"aiohttp": "aiohttp client", "raw": "raw asyncio HTTP/1.1 client"}[kind]
    where = "in the benchmark process" if processes == 0 else f"split over {processes} processes"
    return {"client": f"{what}, {where}", "client_kind": kind, "client_processes": processes}


@dataclass(frozen=True, slots=True)
class Plan:
    """How much to measure. ``FULL`` for the committed figures, ``QUICK`` for CI."""

    quick: bool
    repeats: int  # runs of every sweep figure
    headline_repeats: int  # paired runs of the limit and the gateway
    thread_configs: tuple[tuple[int, int], ...] | None  # (intra-op, instances); None: per cores
    batch_sizes: tuple[int, ...] | None  # None: 1, 2, 4, ... up to the model's maximum
    inproc_run_s: float
    inproc_warmup_s: float
    limit_headline_run_s: float
    gw_sweep_run_s: float
    gw_headline_run_s: float
    gw_warmup_s: float
    client_setups: tuple[Setup, ...]
    low_requests: int
    low_warmup_s: float
    max_requests_per_run: int
    client_timeout_s: float
    startup_timeout_s: float
    cpu_idle_s: float  # the idle gateway's window (cpu_by_load)
    cpu_trickle_s: float  # the simulator's Poisson trickle
    cpu_level_s: float  # one closed-loop client, and saturation


FULL = Plan(
    quick=False,
    repeats=MIN_FULL_RUNS,
    headline_repeats=MIN_FULL_RUNS,
    thread_configs=None,
    batch_sizes=None,
    inproc_run_s=0.3,
    inproc_warmup_s=0.2,
    limit_headline_run_s=2.5,
    gw_sweep_run_s=1.2,
    gw_headline_run_s=3.0,
    gw_warmup_s=0.3,
    client_setups=(("aiohttp", 0), ("aiohttp", 2), ("raw", 0)),
    low_requests=1500,
    low_warmup_s=0.5,
    max_requests_per_run=500_000,
    client_timeout_s=10.0,
    startup_timeout_s=180.0,
    cpu_idle_s=5.0,
    cpu_trickle_s=15.0,
    cpu_level_s=3.0,
)
QUICK = Plan(
    quick=True,
    repeats=1,
    headline_repeats=2,
    thread_configs=((1, 1), (1, min(2, usable_cores()))),
    batch_sizes=(1, 4, 16),
    inproc_run_s=0.15,
    inproc_warmup_s=0.05,
    limit_headline_run_s=0.3,
    gw_sweep_run_s=0.6,
    gw_headline_run_s=0.8,
    gw_warmup_s=0.2,
    client_setups=(("aiohttp", 0), ("aiohttp", 2), ("raw", 0)),
    low_requests=200,
    low_warmup_s=0.2,
    max_requests_per_run=50_000,
    client_timeout_s=10.0,
    startup_timeout_s=50.0,
    cpu_idle_s=0.5,
    cpu_trickle_s=2.0,
    cpu_level_s=0.5,
)
