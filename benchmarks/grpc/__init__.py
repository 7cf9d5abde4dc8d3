"""Where the gRPC server runs (``iotgw bench grpc``): on the serving process's event loop, or
behind the ingest processes' hop. A fixed number of one-row ``sensor_mlp`` requests, raw tensors
both ways, from a closed loop of ``CONCURRENCY`` calls in this process, against:

- ``grpc_loop``: gRPC on the gateway's event loop (what ``iotgw serve`` does);
- ``http_loop``: the same request as HTTP binary tensors, on the same loop;
- ``http_ingest1``: the same HTTP request through one ingest process (``--ingest-processes 1``):
  the hop a gRPC server in the ingest processes would add (decoding in the ingest process, the
  Unix-socket frames, the serving process's hub), which does not depend on the transport.

Arms are interleaved per round, rounds repeated; per arm: requests/s (median and spread over the
rounds), client-side p50/p99 and the gateway's CPU per request (its process tree). The summary
holds each arm's median throughput and CPU per request, and the ratio of the ingest hop's
throughput to the loop's in the same rounds.

Run with ``iotgw bench grpc [--quick] [--out DIR]`` or ``python -m benchmarks.grpc``.
"""

from benchmarks.grpc.run import main

__all__ = ["main"]
