"""Ctrl-C in the terminal that runs ``iotgw serve``: the terminal sends SIGINT to the whole
foreground process group, the gateway's worker processes (the online tuner's queueing-model
process among them) as well as the gateway. The gateway drains and stops them; a worker must not
die of the signal on its own and print a KeyboardInterrupt traceback over the shutdown."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from rrl.agent.model_agent import MODEL_NICENESS
from tests.brokers import free_port
from tests.gateway.helpers import make_repo
from tests.gateway.serve_process import DEADLINE_S, serve_command

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not sys.platform.startswith("linux"), reason="finds the worker process in /proc (Linux)"
    ),
]


def _children(pid: int) -> Iterator[tuple[int, bytes]]:
    """(pid, command line) of each child of ``pid``."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            kids = (task / "children").read_text().split()
        except OSError:
            continue  # a thread that ended meanwhile
        for kid in kids:
            try:
                yield int(kid), Path(f"/proc/{kid}/cmdline").read_bytes()
            except OSError:
                continue  # exited while we looked


def _tuner_worker(pid: int) -> int | None:
    """The tuner's queueing-model process, once its pool initializer ran: a child started by
    multiprocessing's spawn at the model process's niceness. (The profile reader, spawned at an
    agent's start, runs at the parent's and ends; the resource tracker is no spawn_main.)"""
    for kid, argv in _children(pid):
        if b"spawn_main" not in argv:
            continue
        try:
            stat = Path(f"/proc/{kid}/stat").read_text()
        except OSError:
            continue  # exited while we looked
        if int(stat.rsplit(")", 1)[1].split()[16]) == MODEL_NICENESS:  # stat field 19
            return kid
    return None


def _infer(url: str, body: bytes) -> None:
    request = urllib.request.Request(url, data=body, method="POST")
    with urllib.request.urlopen(request, timeout=30) as r:
        r.read()


def test_sigint_to_the_process_group_stops_the_gateway_without_a_traceback(
    demo_repo: Path, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo", demo_repo, {"sensor_mlp": None})
    port = free_port()
    log = tmp_path / "serve.log"
    # The tuner on (the tests' default is off): its agent starts the queueing model's process
    # pool once the model has traffic. A session of its own stands for the terminal's
    # foreground process group, which Ctrl-C signals as a whole.
    env = {**os.environ, "IOTGW_TUNER__ENABLED": "true", "IOTGW_TUNER__INTERVAL_S": "0.2"}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            serve_command(repo, tmp_path, port, "--no-mqtt"),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + DEADLINE_S
        while True:
            assert proc.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, f"gateway never ready:\n{log.read_text()}"
            try:
                with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            time.sleep(0.1)
        with urllib.request.urlopen(f"{url}/v2/models/sensor_mlp", timeout=5) as r:
            spec = json.loads(r.read())["inputs"][0]
        width = int(spec["shape"][-1])
        body = json.dumps(
            {
                "inputs": [
                    {
                        "name": spec["name"],
                        "datatype": "FP32",
                        "shape": [1, width],
                        "data": [0.1] * width,
                    }
                ]
            }
        ).encode()
        # Traffic until the tuner's worker process is running: Ctrl-C must find it alive.
        while _tuner_worker(proc.pid) is None:
            assert proc.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, f"no tuner process started:\n{log.read_text()}"
            for _ in range(20):
                _infer(f"{url}/v2/models/sensor_mlp/infer", body)
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=DEADLINE_S) == 0, log.read_text(errors="replace")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log.read_text(errors="replace")
    assert "Traceback" not in text, text
    assert "KeyboardInterrupt" not in text, text
