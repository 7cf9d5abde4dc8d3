"""``iotgw bench tuner``: the online tuner end to end, against the baselines a user would compare
it with, on scenarios whose rates are fractions of the capacity measured at the start of the run.

Per scenario (``scenarios``): measure capacity (``iotgw sim``'s own ramp) and where the CPU goes
on it (``cpu``), measure service times in process and calibrate the gateway's costs
(``servicetimes``), replay each seed's trace through a model of the batcher and the gateway's
event loop for the request-level grid under a few thread settings (``replay``, ``search``) to
pick the best static configurations and the per-phase oracle, then run every
arm (``arms``) for real on a fresh gateway and summarize (``report``) into
``benchmarks/results/tuner_e2e.json``.
"""

from benchmarks.tuner.cli import cli
from benchmarks.tuner.run import NAME, Options, main, run

__all__ = ["NAME", "Options", "cli", "main", "run"]
