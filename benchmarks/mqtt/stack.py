"""What the MQTT benchmark runs against, each in its own process on 127.0.0.1: Mosquitto, the
bare echo responder, the gateway (MQTT through that broker, HTTP beside it) and the load-client
processes; all stopped on the way out, whatever happens."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from benchmarks.clients import ClientProcesses
from benchmarks.common import ServerProcess
from benchmarks.mqtt.plan import MODEL, Plan
from benchmarks.mqtt_clients import run_load_job
from benchmarks.servers import MQTT_ECHO_READY, start_mosquitto, start_mqtt_echo, start_mqtt_gateway


@dataclass(frozen=True, slots=True)
class Stack:
    broker: ServerProcess
    port: int  # the broker's
    url: str  # the gateway's HTTP base
    gateway: ServerProcess
    clients: ClientProcesses
    # target -> (request topic prefix, the responder's pid): the echo and the gateway
    targets: dict[str, tuple[str, int]]


@contextlib.contextmanager
def open_stack(folder: Path, plan: Plan) -> Iterator[Stack]:
    from models.demo import ensure_demo_repository

    repo = ensure_demo_repository(folder / "repo")
    with contextlib.ExitStack() as stack:
        broker, port = start_mosquitto(folder)
        stack.enter_context(broker)
        echo = stack.enter_context(start_mqtt_echo(folder, port))
        gateway, url = start_mqtt_gateway(repo, folder, port)
        stack.enter_context(gateway)
        clients = stack.enter_context(
            ClientProcesses(plan.processes, run_load_job, name="bench-mqtt-client")
        )
        echo.wait_for_log(MQTT_ECHO_READY, 30)
        gateway.wait_for_log("MQTT: connected", 180)
        yield Stack(
            broker=broker,
            port=port,
            url=url,
            gateway=gateway,
            clients=clients,
            targets={
                "echo": ("echo/req", echo.pid),
                "gateway": (f"iotgw/infer/{MODEL}/req", gateway.pid),
            },
        )
