"""``iotgw bench mqtt``: the gateway's MQTT path against a bare MQTT echo through the same broker,
and against the gateway's own HTTP path, side by side in one run.

For QoS 0 and QoS 1, on the MLP (``sensor_mlp``), one binary-framed 1x32 FP32 request:

- **low load**: one device, one request at a time; p50/p95/p99 of send -> reply at the device,
  for a bare echo responder (publish -> responder -> reply: the limit) and for the gateway,
  interleaved in every round. Knobs ``batch_timeout_ms=0, max_batch_size=1``.
- **saturation**: a closed loop driven by ``processes`` load-client processes, each with its own
  connection and ``in_flight`` requests outstanding (a client sends its next request when the
  reply to its last one arrives). Throughput = requests answered inside the timed window per
  second; a request not answered within the timeout is lost and counted. Echo and gateway over
  MQTT, and the gateway over HTTP with **the same number of processes and the same concurrency**
  (aiohttp keep-alive connections, one per request in flight; also the HTTP bench's raw client,
  the HTTP path's best case), knobs
  ``batch_timeout_ms=1, max_batch_size=32`` for both paths. The MQTT / HTTP ratio is taken per
  round (runs next to each other) and its median quoted.

The MQTT load clients use paho-mqtt's callback API directly (one client per process, MQTT 5,
TCP_NODELAY): per request they cost the shared cores less than an asyncio client, so they do not
cap the figure they measure. The HTTP load clients are aiohttp, as a device fleet or a typical
caller would use. Both are spawned once and reused, and every window records the CPU the
gateway, the broker, the echo, the clients and everything else on the machine used meanwhile
(``cpu_cores``), so a run disturbed by other work shows it.

Mosquitto (``set_tcp_nodelay true``), the echo responder, the gateway and the load clients are
separate processes on 127.0.0.1; everything stops by itself (bounded in time and requests).

The modules: ``plan`` (how much, and the request), ``stack`` (the processes), ``experiments``
(low load and saturation), ``report`` and ``run``. The MQTT load client and the echo responder
are ``benchmarks.mqtt_clients`` and ``benchmarks.echo``; the HTTP one is ``benchmarks.loadgen``.
"""

from benchmarks.mqtt.run import main, run

__all__ = ["main", "run"]
