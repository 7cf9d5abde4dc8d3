"""The servers the benchmarks measure and measure against, each started in its own process
(``benchmarks.common.ServerProcess``: stopped on the way out, whatever happens): the gateway
(HTTP only, or with an MQTT broker), Mosquitto, and the bare echo servers of
``benchmarks.echo``; plus the gateway's admin calls the benchmarks make (``set_knobs``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import ServerProcess, free_port, python_argv

HOST = "127.0.0.1"
# What the echo servers of ``benchmarks.echo`` print once they listen.
HTTP_ECHO_READY = "echo listening on port"
MQTT_ECHO_READY = "echo ready"


def admin_request(
    method: str, url: str, doc: Any = None, timeout_s: float = 60.0
) -> tuple[int, Any]:
    """(status, JSON reply) of one call to a gateway's HTTP API; an error status is returned,
    not raised."""
    data = None if doc is None else json.dumps(doc).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def set_knobs(base: str, model: str, knobs: dict[str, Any]) -> dict[str, Any]:
    """Set version 1's knobs; returns them as the gateway reports them."""
    status, doc = admin_request("PUT", f"{base}/admin/models/{model}/versions/1/knobs", knobs)
    if status != 200:
        raise RuntimeError(f"setting knobs {knobs} of {model} failed: HTTP {status} {doc}")
    return dict(doc["knobs"])


def clean_env() -> dict[str, str]:
    """This environment without IOTGW_* variables: the gateway runs on its defaults plus the
    options given here, whatever the caller's shell sets."""
    return {k: v for k, v in os.environ.items() if not k.startswith("IOTGW_")}


# -- the gateway -------------------------------------------------------------------------------


def start_gateway(
    repo: Path,
    workdir: Path,
    timeout_s: float,
    *,
    tuner_args: Sequence[str] = ("--no-tuner",),  # the configurations compared are set here
    env: Mapping[str, str] | None = None,
    log_name: str = "gateway.log",
    args: Sequence[str] = (),
    prefix: Sequence[str] = (),
    broker: str | None = None,
    client_id: str = "bench-gateway",
) -> tuple[ServerProcess, str]:
    """``iotgw serve`` over HTTP only (no broker to compete for the cores), or also over MQTT
    through ``broker`` (``mqtt://host:port``), ready to serve (with ``broker``: subscribed):
    returns the process and its base URL. ``args`` are more serve options; ``prefix`` runs it
    under another command (``taskset -c 0``)."""
    mqtt = (
        ["--no-mqtt"]
        if broker is None
        else ["--broker", broker, "--mqtt-client-id", client_id, "--receive-maximum", "256"]
    )
    argv = [
        *prefix,
        *python_argv(
            "gateway.cli",
            "serve",
            "--host",
            HOST,
            "--http-port",
            "0",
            "--grpc-port",
            "0",
            "--model-repo",
            str(repo),
            "--cache-dir",
            str(workdir / "cache"),
            "--log-level",
            "INFO",
            *mqtt,
            *tuner_args,
            *args,
        ),
    ]
    server = ServerProcess(argv, log_path=workdir / log_name, env={**clean_env(), **(env or {})})
    try:
        port = int(server.wait_for_log(r"HTTP listening on http://[^:]+:(\d+)", timeout_s)[1])
        base = f"http://{HOST}:{port}"
        wait_ready(server, base, timeout_s)
    except BaseException:
        server.stop()
        raise
    return server, base


def wait_ready(server: ServerProcess, base: str, timeout_s: float) -> None:
    """Poll ``/v2/health/ready`` until it answers 200 (the models are loaded)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(OSError):
            status, _ = admin_request("GET", f"{base}/v2/health/ready", timeout_s=5)
            if status == 200:
                return
        if server.proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the gateway did not get ready:\n{server.log_text()[-4000:]}")
        time.sleep(0.1)


def start_mqtt_gateway(repo: Path, folder: Path, broker_port: int) -> tuple[ServerProcess, str]:
    """``iotgw serve`` with Mosquitto at ``broker_port`` (MQTT 5) and HTTP on a free port, not
    waited for (``wait_for_log("MQTT: connected", ...)``): returns the process and its base URL."""
    http_port = free_port()
    argv = python_argv(
        "gateway.cli",
        "serve",
        "--model-repo",
        str(repo),
        "--http-port",
        str(http_port),
        "--grpc-port",
        "0",
        "--broker",
        f"mqtt://{HOST}:{broker_port}",
        "--mqtt-client-id",
        "bench-gateway",
        "--receive-maximum",
        "256",
        "--cache-dir",
        str(folder),
        "--no-tuner",  # the knobs compared are the ones set here, not the tuner's
    )
    server = ServerProcess(argv, log_path=folder / "gateway.log")
    return server, f"http://{HOST}:{http_port}"


# -- Mosquitto ---------------------------------------------------------------------------------


def start_mosquitto(folder: Path) -> tuple[ServerProcess, int]:
    """Mosquitto on a free loopback port with Nagle off and deep queues, accepting connections:
    returns the process and its port."""
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    port = free_port()
    conf = folder / "mosquitto.conf"
    conf.write_text(
        f"listener {port} {HOST}\nallow_anonymous true\nset_tcp_nodelay true\n"
        "max_queued_messages 100000\nmax_inflight_messages 1000\n"
        "persistence false\n"
    )
    server = ServerProcess([binary, "-c", str(conf)], log_path=folder / "mosquitto.log")
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection((HOST, port), timeout=0.2).close()
            return server, port
        except OSError:
            if time.monotonic() > deadline:
                server.stop()
                raise
            time.sleep(0.05)


# -- the echo servers ----------------------------------------------------------------------------


def start_http_echo(workdir: Path, timeout_s: float) -> tuple[ServerProcess, str]:
    """The bare aiohttp echo (``benchmarks.echo``), listening: the process and its base URL."""
    server = ServerProcess(
        python_argv("benchmarks.echo", "http"), log_path=workdir / "echo.log", env=clean_env()
    )
    try:
        port = int(server.wait_for_log(HTTP_ECHO_READY + r" (\d+)", timeout_s)[1])
    except BaseException:
        server.stop()
        raise
    return server, f"http://{HOST}:{port}"


def start_mqtt_echo(folder: Path, broker_port: int) -> ServerProcess:
    """The bare MQTT echo responder (``benchmarks.echo``) on the broker at ``broker_port``, not
    waited for (``wait_for_log(MQTT_ECHO_READY, ...)``)."""
    return ServerProcess(
        python_argv("benchmarks.echo", "mqtt", str(broker_port)), log_path=folder / "echo.log"
    )
