"""Ingest benchmark: throughput against cores and ingest processes (``iotgw bench ingest``).

The gateway (``iotgw serve --no-tuner``, HTTP only, JSON bodies of one row, the model's
configured knobs) is pinned with ``taskset`` to 1 core, then to every core of the machine, and
run with 0 ingest processes (the serving process does all protocol work) and with 1 and 2
(``--ingest-processes``). A closed loop of clients (the aiohttp client, in client processes that
are not pinned: they share the machine with the gateway, as they must on a small box) keeps
``CONCURRENCY`` requests in flight. Per arm: requests/s, client-side p50/p99, lost requests,
and the gateway's CPU per request (its process tree: the serving and the ingest processes).

Arms are interleaved per round (every arm once per round, rounds repeated), so that drift of a
shared machine spreads over all arms. The summary holds, per model and core count, the ratio of
each ingest arm's throughput to the single-process gateway's in the same rounds
(``<model>_c<cores>_ingest<N>_throughput_ratio``) and the best one.

Run with ``iotgw bench ingest [--quick] [--out DIR]`` or ``python -m benchmarks.ingest``.
"""

from benchmarks.ingest.run import main

__all__ = ["main"]
