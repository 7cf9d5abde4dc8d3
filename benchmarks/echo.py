"""The bare echo servers the gateway's round trips are held against, each run in its own
process by ``benchmarks.servers``:

- ``python -m benchmarks.echo http [PORT]``: an aiohttp server with the gateway's inference
  routes that sends every body back with its framing header;
- ``python -m benchmarks.echo mqtt BROKER_PORT``: a paho client that publishes every request
  back on its Response Topic with its Correlation Data, at its QoS.

Each prints its ready line (``servers.HTTP_ECHO_READY`` / ``servers.MQTT_ECHO_READY``) once it
serves, and stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

import paho.mqtt.client as paho
from aiohttp import web

from benchmarks.mqtt_clients import CORRELATION_DATA, Packed, connect, mqtt_string, receive_with
from benchmarks.servers import HOST, HTTP_ECHO_READY, MQTT_ECHO_READY
from gateway.codecs.oip import HEADER_LENGTH
from gateway.mqtt.paho_seam import Message


async def _echo(request: web.Request) -> web.Response:
    body = await request.read()
    headers = {}
    length = request.headers.get(HEADER_LENGTH)
    if length is not None:
        headers[HEADER_LENGTH] = length
    return web.Response(body=body, content_type="application/octet-stream", headers=headers)


async def _serve_http(host: str, port: int) -> None:
    app = web.Application()
    app.router.add_post("/v2/models/{model}/versions/{version}/infer", _echo)
    app.router.add_post("/v2/models/{model}/infer", _echo)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"{HTTP_ECHO_READY} {bound}", flush=True)
    await stop.wait()
    await runner.cleanup()


def serve_http_echo(host: str = HOST, port: int = 0) -> None:
    """The bare aiohttp echo: the same route shape as the gateway, reads the whole body and
    sends it back with the same framing header. Nothing else."""
    asyncio.run(_serve_http(host, port))


def serve_mqtt_echo(broker_port: int) -> None:
    """The bare MQTT echo: every request is published back on its Response Topic with its
    Correlation Data, at its QoS, from the receive callback (no waiting on acks)."""
    client = connect("bench-echo", broker_port, "echo/req/+", 1)

    def on_message(c: paho.Client, _u: object, message: Message) -> None:
        props = message.properties
        c.publish(
            props.ResponseTopic,  # type: ignore[union-attr]
            message.payload,
            qos=message.qos,
            # Pre-packed bytes where paho wants Properties: it only calls pack() (see Packed).
            properties=Packed(CORRELATION_DATA + mqtt_string(props.CorrelationData)),  # type: ignore[union-attr,arg-type]
        )

    receive_with(client, on_message)
    print(MQTT_ECHO_READY, flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    client.loop_forever()


def _cli(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.echo", description=__doc__)
    p.add_argument("transport", choices=["http", "mqtt"])
    p.add_argument("port", type=int, nargs="?", default=0, help="HTTP: listen; MQTT: the broker")
    args = p.parse_args(argv)
    if args.transport == "http":
        serve_http_echo(port=args.port)
    else:
        serve_mqtt_echo(args.port)
    return 0


if __name__ == "__main__":
    sys.exit(_cli())
