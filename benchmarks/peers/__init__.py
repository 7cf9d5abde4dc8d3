"""Peers benchmark: the gateway against MLServer on the same machine (``iotgw bench peers``).

MLServer 1.7.1 is installed into its own virtual environment under the cache
(``mlserver_env``: built once, then reused without network; rebuilt offline from its wheelhouse
when needed) and serves the same ONNX files as the gateway through an ONNX Runtime runtime
written here (``mlserver_runtime``: the gateway's session options and threads). Both servers
batch adaptively with the gateway's ``--no-tuner`` arm's setting: up to 32 per batch, 2 ms to
fill one.

For ``vision_cnn`` and ``sensor_mlp``, at 1 and 8 rows per request and 1, 8, 32 and 128
concurrent clients, the same closed-loop load generator (``benchmarks.loadgen``) drives, in
turn and round after round: MLServer and the gateway on the same OIP JSON body, and the gateway
on the binary tensor extension (which MLServer lacks) beside them. The ratios (gateway over
MLServer, within each round, median over 5 rounds) are the summary:
``vs_mlserver_throughput_ratio_c32`` (target >= 1.5), ``vs_mlserver_p99_ratio_c32`` (<= 1.0)
and ``vs_mlserver_p50_ratio_c1`` (<= 0.8), per model, at one row per request; the binary
extension's and the eight-row figures beside them.

``--quick`` (CI) measures 1 and 32 clients once, briefly; when MLServer cannot be installed
there (no registry and nothing cached) it runs the gateway's arms alone and says why in the
results (``summary.mlserver_skipped``). A full run without MLServer fails instead.

Run with ``iotgw bench peers [--quick] [--out DIR]`` or ``python -m benchmarks.peers``. Results:
``benchmarks/results/peers.json`` (``peers.quick.json`` in quick mode, or under ``--out``).
"""

from benchmarks.peers.run import main, run

__all__ = ["main", "run"]
