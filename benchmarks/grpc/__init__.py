"""Where the gRPC server runs (``iotgw bench grpc``): on the serving process's event loop, or
behind the ingest processes' hop. A fixed number of one-row ``sensor_mlp`` requests, raw tensors
both ways, from a closed loop of ``CONCURRENCY`` calls in this process, against:

- ``grpc_loop``: gRPC on the gateway's event loop (what ``iotgw serve`` does);
- ``http_loop``: the same request as HTTP binary tensors, on the same loop;
- ``http_ingest1``: the same HTTP request through one ingest process (``--ingest-processes 1``):
  the hop a gRPC server in the ingest processes would add (decoding in the ingest process, the
  Unix-socket frames, the serving process's hub), which does not depend on the transport;
- ``grpc_loop_c32`` and ``http_json_loop_c32``: gRPC against the Open Inference Protocol's JSON
  body over HTTP (JSON reply too), both on the loop, from ``TARGET_CONCURRENCY`` (32) calls at
  once: the comparison issue 33's target names (gRPC at least as fast as HTTP JSON).

Arms are interleaved per round, rounds repeated; per arm: requests/s (median and spread over the
rounds), client-side p50/p99 and the gateway's CPU per request (its process tree). The summary
holds each arm's median throughput and CPU per request, the ratio of the ingest hop's
throughput to the loop's in the same rounds, gRPC's over HTTP binary's at 16 calls, and gRPC's
over HTTP JSON's at 32 (``grpc_vs_http_json_throughput_ratio_c32``, with ``_target_met``).

Run with ``iotgw bench grpc [--quick] [--out DIR]`` or ``python -m benchmarks.grpc``.
"""

from benchmarks.grpc.run import main

__all__ = ["main"]
