"""Peers benchmark: the gateway against MLServer and Triton on the same machine
(``iotgw bench peers``).

Each peer is installed into its own virtual environment under the cache (``peer_env``: built
once, then reused without network; rebuilt offline from its wheelhouse when needed): MLServer
1.7.1 serves the ONNX files through an ONNX Runtime runtime written here
(``mlserver_runtime``); Triton is PyTriton 0.7.0's bundled ``tritonserver`` (C++ HTTP front
end and dynamic batcher, Python backend) with one ONNX Runtime session per instance as the
bound callable (``triton_server``; its own NumPy 1.x). Every server gets the best static
configuration (``plan.STATIC_KNOBS``: maximum batch, batch timeout / queue delay, instances,
intra- and inter-op threads).

The arms: MLServer and Triton, the default ``iotgw serve`` (agent on: the arm that counts) and
``iotgw serve --no-tuner`` with the best static configuration, on the same OIP JSON body
(Triton's tensors carry the ONNX names, so one body serves all), and the static gateway on the
binary tensor extension beside them. Four loads, arms interleaved round after round:

1. The project's closed-loop client (``benchmarks.loadgen``) at 1 and 8 rows per request and 1,
   8, 32 and 128 clients: the MLServer summary, ``vs_mlserver_throughput_ratio_c32`` (target
   >= 1.5), ``vs_mlserver_p99_ratio_c32`` (<= 1.0), ``vs_mlserver_p50_ratio_c1`` (<= 0.8).
2. wrk (``wrk_points``) at 1, 8, 32 and 128 connections, one row per request: the Triton
   summary, ``vs_triton_throughput_ratio_c8``, ``_c32``, ``_c128`` (>= 1.2),
   ``vs_triton_p99_ratio_c32`` (<= 1.0), ``vs_triton_p50_ratio_c1`` (<= 0.5).
3. h2load over gRPC (``grpc_points``) at 1, 8, 32 and 128 calls in flight, one row per
   request: both gateways' gRPC endpoints against Triton's, the same serialized
   ``ModelInferRequest`` to each, the server's own success count checked against every run;
   ``grpc_vs_triton_grpc_throughput_ratio_c32`` (>= 1.0), and the other closed-loop figures as
   through wrk (``grpc_vs_triton_grpc_...``), each beside its floor.
4. Poisson arrivals (``capacity``, through ``iotgw sim``): each arm's capacity at the model's
   SLO, ``vs_triton_capacity_ratio`` (>= 1.25).

Each Triton figure stands beside its noise floor and its verdict (``triton_report``,
``benchmarks.judging.judge``); the static arm's (``static_``) and the project's client's
(``loadgen_``) beside it.

``--quick`` (CI) measures 1 and 32 clients once, briefly, and two steps of each capacity
search; when a peer cannot be installed there (no registry and nothing cached) it runs without
that arm and says why in the results (``summary.mlserver_skipped``, ``summary.triton_skipped``).
A full run without both peers fails instead.

Run with ``iotgw bench peers [--quick] [--out DIR]`` or ``python -m benchmarks.peers``. Results:
``benchmarks/results/peers.json`` (``peers.quick.json`` in quick mode, or under ``--out``).
"""

from benchmarks.peers.run import main, run

__all__ = ["main", "run"]
