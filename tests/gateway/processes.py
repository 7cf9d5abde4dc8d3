"""``iotgw serve`` as a separate process, for tests that need several gateways or a restart."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.brokers import free_port


@dataclass
class GatewayProcess:
    process: subprocess.Popen[bytes]
    http_port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def metrics(self) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as r:
            return r.read().decode()

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 60.0) -> int:
        """Send ``sig`` and wait for the exit; returns the exit status (negative: the signal
        that ended it). A gateway still alive after ``timeout_s`` is killed and the test fails:
        a stop that hangs is a defect, not a slow exit."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(
                f"gateway still running {timeout_s} s after signal {sig}:\n{self.log.read_text()}"
            ) from None


def start_gateway(
    repo: Path, folder: Path, *, broker: str, client_id: str, extra: tuple[str, ...] = ()
) -> GatewayProcess:
    port = free_port()
    log = folder / f"{client_id}-{port}.log"
    cmd = [
        sys.executable,
        "-m",
        "gateway.cli",
        "serve",
        "--model-repo",
        str(repo),
        "--cache-dir",
        str(folder),
        "--http-port",
        str(port),
        "--broker",
        broker,
        "--mqtt-client-id",
        client_id,
        *extra,
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    gw = GatewayProcess(proc, port, log)
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"gateway exited with {proc.returncode}:\n{log.read_text()}")
        text = log.read_text(errors="replace")
        if "ready: http" in text and "MQTT: connected" in text:
            return gw
        if time.monotonic() > deadline:
            gw.stop(signal.SIGKILL)
            raise AssertionError(f"gateway not ready in 120 s:\n{text}")
        time.sleep(0.1)


@contextlib.contextmanager
def gateway_process(
    repo: Path, folder: Path, *, broker: str, client_id: str, extra: tuple[str, ...] = ()
) -> Iterator[GatewayProcess]:
    gw = start_gateway(repo, folder, broker=broker, client_id=client_id, extra=extra)
    try:
        yield gw
    finally:
        gw.stop(signal.SIGKILL)


def mqtt_requests_served(metrics_text: str) -> float:
    from tests.gateway.helpers import metric_samples

    return sum(
        value
        for name, labels, value in metric_samples(metrics_text)
        if name == "iotgw_requests_total" and labels.get("transport") == "mqtt"
    )
