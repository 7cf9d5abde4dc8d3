"""The two servers of the peers benchmark, each in its own process on loopback: MLServer (its
own environment, the runtime of ``mlserver_runtime``) and ``iotgw serve --no-tuner``, both with
adaptive batching at ``plan.MAX_BATCH_SIZE`` / ``plan.BATCH_TIMEOUT_MS``."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from benchmarks.common import ServerProcess, free_port
from benchmarks.http.workload import Model
from benchmarks.peers.mlserver_env import MLServerEnv
from benchmarks.peers.plan import BATCH_TIMEOUT_MS, MAX_BATCH_SIZE
from benchmarks.servers import HOST, admin_request, clean_env, set_knobs, start_gateway

RUNTIME_MODULE = "peers_onnx_runtime"  # the name ``mlserver_runtime.py`` is copied under
RUNTIME_SOURCE = Path(__file__).with_name("mlserver_runtime.py")


def start_gateway_batching(
    repo: Path, workdir: Path, models: Mapping[str, Model], timeout_s: float
) -> tuple[ServerProcess, str, dict[str, dict[str, Any]]]:
    """``iotgw serve --no-tuner`` with every model's batching set: the process, its base URL
    and each model's knobs as the gateway reports them."""
    server, base = start_gateway(repo, workdir, timeout_s)
    batching = {"max_batch_size": MAX_BATCH_SIZE, "batch_timeout_ms": BATCH_TIMEOUT_MS}
    try:
        knobs = {name: set_knobs(base, name, batching) for name in models}
    except BaseException:
        server.stop()
        raise
    return server, base, knobs


def write_mlserver_repository(
    folder: Path, models: Mapping[str, Model], knobs: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """MLServer's settings and one folder per model (its ``model-settings.json`` and the runtime
    module) under ``folder``, on free loopback ports; returns the server settings. Each model
    gets the gateway's ONNX file and the gateway's intra- and inter-op threads."""
    settings = {
        "host": HOST,
        "http_port": free_port(),
        "grpc_port": free_port(),
        "metrics_port": free_port(),
        # Its Prometheus files, which it would otherwise write to .metrics in the working folder.
        "metrics_dir": str(folder / "metrics"),
        "debug": False,  # no per-request access log, as in production
        # MLServer's default: inference in one worker process beside the HTTP process.
        "parallel_workers": 1,
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "settings.json").write_text(json.dumps(settings, indent=1))
    for name, model in models.items():
        sub = folder / name
        sub.mkdir(exist_ok=True)
        shutil.copyfile(RUNTIME_SOURCE, sub / f"{RUNTIME_MODULE}.py")
        model_settings = {
            "name": name,
            "implementation": f"{RUNTIME_MODULE}.OnnxRuntimeModel",
            "max_batch_size": MAX_BATCH_SIZE,
            "max_batch_time": BATCH_TIMEOUT_MS / 1000.0,
            "parameters": {
                "uri": str(model.version.directory / model.version.config.path),
                "version": str(model.version.version),
                "extra": {
                    "intra_op_threads": int(knobs[name]["intra_op_threads"]),
                    "inter_op_threads": int(knobs[name]["inter_op_threads"]),
                },
            },
        }
        (sub / "model-settings.json").write_text(json.dumps(model_settings, indent=1))
    return settings


def start_mlserver(
    env: MLServerEnv,
    folder: Path,
    models: Mapping[str, Model],
    knobs: Mapping[str, Mapping[str, Any]],
    timeout_s: float,
) -> tuple[ServerProcess, str, dict[str, Any]]:
    """``mlserver start`` on the repository written under ``folder``, every model ready: the
    process, its base URL and its settings."""
    settings = write_mlserver_repository(folder, models, knobs)
    # Not this project's variables, nor MLServer's own: it runs on the settings written here.
    environ = {k: v for k, v in clean_env().items() if not k.startswith("MLSERVER")}
    argv = [str(env.mlserver), "start", str(folder)]
    server = MLServerProcess(argv, log_path=folder.parent / "mlserver.log", env=environ)
    base = f"http://{HOST}:{settings['http_port']}"
    try:
        _wait_models_ready(server, base, list(models), timeout_s)
    except BaseException:
        server.stop()
        raise
    return server, base, settings


class MLServerProcess(ServerProcess):
    """MLServer stops on SIGINT (it leaves SIGTERM to its parent process manager): SIGINT to
    the process group first, so that the HTTP process and its inference worker shut down
    cleanly, then ``ServerProcess.stop`` for whatever is left."""

    def stop(self, timeout_s: float = 10.0) -> int | None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout_s)
        return super().stop(timeout_s)


def _wait_models_ready(
    server: ServerProcess, base: str, names: list[str], timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    waiting = list(names)
    while waiting:
        with contextlib.suppress(OSError, ValueError):  # not listening yet, or not JSON
            status, _ = admin_request(
                "GET", f"{base}/v2/models/{waiting[0]}/versions/1/ready", timeout_s=5
            )
            if status == 200:
                waiting.pop(0)
                continue
        if server.proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"MLServer did not get ready:\n{server.log_text()[-4000:]}")
        time.sleep(0.1)
