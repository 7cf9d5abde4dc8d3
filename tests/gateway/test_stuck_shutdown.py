"""A gateway whose backend call hangs past the batch watchdog still shuts down on SIGTERM: the
stuck thread is abandoned, not waited for (a Python thread cannot be stopped)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.brokers import free_port
from tests.gateway.helpers import GENEROUS_TIMEOUT_US, make_repo

pytestmark = pytest.mark.slow

# A real ONNX Runtime session whose calls with exactly HANG_ROWS rows never return.
SCRIPT = textwrap.dedent(
    """
    import asyncio, sys, threading
    from pathlib import Path

    import models.backends
    from gateway.main import serve
    from gateway.settings.schema import GatewaySettings

    HANG_ROWS = 3
    real_loader = models.backends.load_runtime

    class Hanging:
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def infer(self, inputs):
            if next(iter(inputs.values())).shape[0] == HANG_ROWS:
                threading.Event().wait()  # never set: a backend that hangs for good
            return self.inner.infer(inputs)

    models.backends.load_runtime = lambda version, threads: Hanging(real_loader(version, threads))
    settings = GatewaySettings.load(
        http={"port": int(sys.argv[2]), "host": "127.0.0.1"},
        serving={
            "model_repo": Path(sys.argv[1]),
            "cache_dir": Path(sys.argv[3]),
            "batch_watchdog_s": 1.0,
            "shutdown_grace_s": 10.0,
        },
        mqtt={"enabled": False},
    )
    sys.exit(asyncio.run(serve(settings)))
    """
)


def _post(url: str, rows: int) -> tuple[int, dict[str, object]]:
    body = {
        "inputs": [
            {"name": "features", "datatype": "FP32", "shape": [rows, 32], "data": [0.1] * 32 * rows}
        ],
        "parameters": {"timeout": GENEROUS_TIMEOUT_US},
    }
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _wait_ready(base: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        try:
            with urllib.request.urlopen(f"{base}/v2/health/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise AssertionError(f"gateway never ready:\n{log.read_text()}")


def test_sigterm_exits_although_a_backend_call_is_stuck(demo_repo: Path, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", demo_repo, {"sensor_mlp": {"batching": {"concurrency": 1}}})
    port = free_port()
    log = tmp_path / "gateway.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", SCRIPT, str(repo), str(port), str(tmp_path / "cache")],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_ready(base, proc, log)
        url = f"{base}/v2/models/sensor_mlp/infer"
        status, reply = _post(url, rows=3)
        assert status == 504, reply
        assert _post(url, rows=1)[0] == 200  # served by the replacement instance
        proc.send_signal(signal.SIGTERM)
        # Before the fix the process hung in the executor's join of the stuck thread.
        code = proc.wait(timeout=60)
        assert code == 0, log.read_text()
        assert "abandoned" in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
