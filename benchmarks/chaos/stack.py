"""The processes ``iotgw bench chaos`` breaks: a Mosquitto that persists its sessions and can be
restarted on the same port with the same store, and ``iotgw serve`` gateways that can be
SIGKILLed, SIGTERMed and started again with the same client id."""

from __future__ import annotations

import contextlib
import itertools
import os
import pwd
import re
import shutil
import signal
import socket
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from benchmarks.chaos.netns import Host, run_inside
from benchmarks.common import ServerProcess, free_port, python_argv

MODEL = "sensor_mlp"
# Case d overloads a model whose capacity is its compute: three times a capacity set by protocol
# work (sensor_mlp's, about 3,500/s here) is a flood whose relaying alone (devices, broker and
# gateway on the same cores) saturates the machine, so what it would measure is the load
# generator's own contention, not the gateway's admission. ``--overload-model`` picks another.
OVERLOAD_MODEL = "vision_cnn"
_READY = "MQTT: connected"
_starts = itertools.count()


def demo_repository(folder: Path, name: str = MODEL) -> Path:
    """A repository holding only the demo's ONNX model ``name``: starts in seconds."""
    from models.demo import FLOAT_DEMO_MODELS, ensure_demo_repository

    chosen = tuple(m for m in FLOAT_DEMO_MODELS if m.name == name)
    if not chosen:
        raise ValueError(f"{name!r} is not one of the demo's ONNX models")
    return ensure_demo_repository(folder / f"repo-{name}", chosen)


def _wait_listening(address: str, port: int, process: ServerProcess, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((address, port), timeout=0.2).close()
            return
        except OSError:
            if process.proc.poll() is not None:
                raise RuntimeError(f"broker exited:\n{process.log_text()[-2000:]}") from None
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class Mosquitto:
    """Mosquitto with ``persistence true`` (its store in ``folder``): ``restart`` stops it with
    SIGTERM (it writes its store on the way out) and starts it again on the same port. On 127.0.0.1,
    or inside ``host``'s network namespace (case f) on its address."""

    def __init__(self, folder: Path, host: Host | None = None) -> None:
        self.folder = folder
        self.host = host
        self.address = "127.0.0.1" if host is None else host.address
        # A namespace of the run's own has every port free: MQTT's.
        self.port = free_port() if host is None else 1883
        store = folder / "mosquitto-store"
        store.mkdir(parents=True, exist_ok=True)
        self.config = folder / "mosquitto.conf"
        self.config.write_text(
            f"listener {self.port} {self.address}\n"
            "allow_anonymous true\n"
            # Without it a QoS 1 request/reply stalls 40-90 ms on Nagle's algorithm.
            "set_tcp_nodelay true\n"
            # Everything queued for a gateway that is down or a device that reconnects is kept
            # (the default of 1000 per client would drop requests during an outage).
            "max_queued_messages 10000000\n"
            "max_inflight_messages 1000\n"
            "persistence true\n"
            f"persistence_location {store}/\n"
            # Started as root, mosquitto would switch to the 'mosquitto' user, which cannot
            # write its store here: every session would be gone after a restart.
            f"user {pwd.getpwuid(os.getuid()).pw_name}\n"
        )
        self.binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        self.process = self._start()

    @property
    def url(self) -> str:
        return f"mqtt://{self.address}:{self.port}"

    def _start(self) -> ServerProcess:
        log = self.folder / f"mosquitto-{next(_starts)}.log"
        argv = [self.binary, "-c", str(self.config)]
        if self.host is None:
            process = ServerProcess(argv, log_path=log)
            _wait_listening(self.address, self.port, process, 15)
            return process
        host = self.host
        process = ServerProcess(host.exec_argv(argv), log_path=log)
        run_inside(host.namespace, lambda: _wait_listening(host.address, self.port, process, 15))
        return process

    def log_text(self) -> str:
        """What this broker logged since its last start."""
        return self.process.log_text()

    def restart(self) -> float:
        """SIGTERM, wait for the exit, start again; returns the seconds it was down."""
        down_at = time.monotonic()
        self.process.stop(30)
        self.process = self._start()
        return time.monotonic() - down_at

    def stop(self) -> None:
        self.process.stop()

    def __enter__(self) -> Mosquitto:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Gateway:
    """One ``iotgw serve`` process with a fixed client id; ``start`` again after a kill. Inside
    ``host``'s network namespace when given (case f), with ``env`` added to its environment."""

    def __init__(
        self,
        repo: Path,
        folder: Path,
        *,
        client_id: str,
        broker: str | None,
        extra: tuple[str, ...] = (),
        host: Host | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.repo = repo
        self.folder = folder
        self.client_id = client_id
        self.broker = broker
        self.extra = extra
        self.host = host
        self.env = None if env is None else {**os.environ, **env}
        self.process: ServerProcess | None = None
        self.http_port = 0
        # Chosen once: a restart listens where the gRPC clients' channel already points.
        self.grpc_port = free_port()

    def start(self, timeout_s: float = 180) -> str:
        """Start and wait until it is subscribed; returns its log so far."""
        broker = ("--broker", self.broker) if self.broker else ()
        self.http_port = free_port()
        argv = python_argv(
            "gateway.cli",
            "serve",
            "--model-repo",
            str(self.repo),
            "--http-port",
            str(self.http_port),
            "--grpc-port",
            str(self.grpc_port),
            *broker,
            "--mqtt-client-id",
            self.client_id,
            "--no-tuner",  # the knobs stay as configured while things break around them
            "--cache-dir",
            str(self.folder / f"cache-{self.client_id}"),
            *self.extra,
        )
        log = self.folder / f"{self.client_id}-{next(_starts)}.log"
        if self.host is not None:
            argv = self.host.exec_argv(argv)
        self.process = ServerProcess(argv, log_path=log, env=self.env)
        self.process.wait_for_log(_READY, timeout_s)
        return self.process.log_text()

    @property
    def grpc_address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def kill(self, sig: int = signal.SIGKILL, timeout_s: float = 60) -> None:
        """Send ``sig`` to the gateway (and any broker child of it) and wait for the exit."""
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)
        self.process.stop(timeout_s)

    def metrics(self) -> str:
        """The gateway's Prometheus exposition (``/metrics``)."""
        url = f"http://127.0.0.1:{self.http_port}/metrics"

        def read() -> str:
            with urllib.request.urlopen(url, timeout=30) as reply:
                return str(reply.read().decode())

        return read() if self.host is None else run_inside(self.host.namespace, read)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


def embedded_broker_kind(log: str) -> str:
    """Which embedded broker a gateway started (from its start-up log)."""
    match = re.search(r"embedded MQTT broker \((\w+), MQTT ([\d.]+)", log)
    return f"{match.group(1)} (MQTT {match.group(2)})" if match else "unknown"


def rss_bytes(pid: int) -> int | None:
    """Resident set size of ``pid`` from /proc/<pid>/status (VmRSS), in bytes."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    match = re.search(r"^VmRSS:\s+(\d+)\s+kB", text, re.MULTILINE)
    return int(match.group(1)) * 1024 if match else None
