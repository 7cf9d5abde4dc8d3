"""HTTP benchmark: the gateway against the limits it is held to (``iotgw bench http``).

For ``sensor_mlp`` and ``vision_cnn`` (ONNX Runtime), side by side in one run:

1. **The limit.** The same runtime (``models.backends.load_runtime``) called in this process, no
   gateway: (intra-op threads, instances) in {(1, 1), (cores, 1), (1, cores), (1, cores + 1)}
   times batch sizes 1, 2, 4, ... up to the model's maximum, as rows/s, every configuration once
   per round. The best is the limit.
2. **The gateway at saturation.** ``iotgw serve`` in its own process (loopback, port 0), knobs set
   through ``PUT /admin/models/{m}/versions/1/knobs``: the limit's intra-op threads, its
   instances or one more, and the two largest batch sizes whose batch costs at most a quarter of
   the model's SLO; the fastest of those four. Load: a closed loop of N clients, one row per
   request in the binary tensor framing (JSON header + raw FP32, ``binary_data_output``), body
   pre-encoded once. Setups tried at those knobs, at a few N: the aiohttp client
   in the benchmark process, the aiohttp client split over 2 processes, and a minimal raw
   asyncio HTTP/1.1 client (``RawHttpConnection``, a few times cheaper per request: the client
   shares the cores with the server here, unlike devices in production). The fastest setup whose
   p99 stays under the SLO with nothing lost (and the fastest aiohttp one) are then measured
   again between runs of the limit (L G L G ... L); the ratio is the median over rounds of the
   gateway's rows/s over the mean of the two limit runs around it.
   Beside it, the CPU each row costs (gateway server + client, against the limit), which other
   work on a shared machine moves much less than wall-clock rates.
3. **Low load.** One sequential client: a bare aiohttp echo server (its own process, same
   machine, same body, same route shape) against the gateway on ``sensor_mlp`` with
   ``batch_timeout_ms=0``; client-measured send -> reply p50 and p99, with the aiohttp client
   (headline) and the raw one. Overhead = gateway - echo, per round. The in-process batch-1
   runtime time is shown beside it: that part is compute, not overhead.

4. **CPU per request, before and after.** Two more gateways, one on the standard library's
   ``json`` and ``asyncio`` loop, one on orjson and uvloop (``serving.json_codec``,
   ``serving.event_loop``), same knobs, driven in turns with the same closed loop: the gateway
   process's user + system CPU (``/proc``) over requests answered, for ``sensor_mlp`` as JSON
   (the headline, ``cpu_per_request_ratio`` = after / before), as the binary framing, and
   ``vision_cnn`` as JSON (``codec_cpu``).
5. **CPU per request by load.** One more gateway serving HTTP and MQTT (Mosquitto beside it),
   ``sensor_mlp`` as JSON: the gateway process's CPU per answered request at a Poisson trickle
   of 50 requests/s (``iotgw sim``), at one closed-loop client and at saturation (32 in flight),
   over each transport, and the idle gateway's cores; the trickle against saturation is judged
   against 2x with the floor its rounds give (``cpu_by_load``).

Every figure is warmed up and repeated (5 runs, median quoted with min and max; ``--quick``: 1-2
short runs, the whole pipeline in well under a minute). Results: ``benchmarks/results/http.json``
(``http.quick.json`` in quick mode, or under ``--out``). Servers and client processes are stopped
on the way out, whatever happens (and die with the benchmark if it is killed).

Run with ``iotgw bench http [--quick] [--out DIR]`` or ``python -m benchmarks.http``.

The modules: ``plan`` (how much, and the rules), ``workload`` (the models and their request),
``runner`` (the in-process limit), ``bench`` (what the experiments share), one module per
experiment (``limit``, ``saturation``, ``headline``, ``low_load``, ``codec_cpu``,
``cpu_by_load``), ``report``
and ``run``. The
load generator is ``benchmarks.loadgen``; the servers start through ``benchmarks.servers``.
"""

from benchmarks.http.run import main, run

__all__ = ["main", "run"]
