"""The servers of the peers benchmark, each in its own processes on loopback: MLServer (its own
environment, the runtime of ``mlserver_runtime``), Triton (its own environment, the callables of
``triton_server``), ``iotgw serve --no-tuner`` with the best static configuration
(``plan.STATIC_KNOBS``, which both peers get too) and the default ``iotgw serve`` (agent on)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from benchmarks.common import ServerProcess, free_port
from benchmarks.http.workload import Model
from benchmarks.peers.peer_env import PeerEnv, interpreter_libdir
from benchmarks.peers.plan import STATIC_KNOBS
from benchmarks.servers import HOST, admin_request, clean_env, set_knobs, start_gateway

RUNTIME_MODULE = "peers_onnx_runtime"  # the name ``mlserver_runtime.py`` is copied under
RUNTIME_SOURCE = Path(__file__).with_name("mlserver_runtime.py")
TRITON_SCRIPT = Path(__file__).with_name("triton_server.py")


def start_gateway_static(
    repo: Path, workdir: Path, models: Mapping[str, Model], timeout_s: float
) -> tuple[ServerProcess, str, dict[str, dict[str, Any]]]:
    """``iotgw serve --no-tuner`` with every model's best static configuration set: the
    process, its base URL and each model's knobs as the gateway reports them."""
    server, base = start_gateway(repo, workdir, timeout_s, log_name="gateway_static.log")
    try:
        knobs = {name: set_knobs(base, name, STATIC_KNOBS[name].as_dict()) for name in models}
    except BaseException:
        server.stop()
        raise
    return server, base, knobs


def start_gateway_agent(repo: Path, workdir: Path, timeout_s: float) -> tuple[ServerProcess, str]:
    """The default ``iotgw serve`` (its agent on, every setting shipped), as a user starts it."""
    return start_gateway(repo, workdir, timeout_s, tuner_args=(), log_name="gateway_agent.log")


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
            "max_batch_size": int(knobs[name]["max_batch_size"]),
            "max_batch_time": float(knobs[name]["batch_timeout_ms"]) / 1000.0,
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
    env: PeerEnv,
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
    _wait_models_ready(server, base, list(models), timeout_s, "MLServer")
    return server, base, settings


def write_triton_config(
    folder: Path, models: Mapping[str, Model], knobs: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """``triton_server``'s configuration under ``folder``, on free loopback ports: every model's
    ONNX file with the gateway's knobs (maximum batch, queue delay, instances, threads)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "host": HOST,
        "http_port": free_port(),
        "grpc_port": free_port(),
        "metrics_port": free_port(),
        "workspace": str(folder / "workspace"),
        "models": [
            {
                "name": name,
                "path": str(model.version.directory / model.version.config.path),
                "max_batch_size": int(knobs[name]["max_batch_size"]),
                "max_queue_delay_us": round(float(knobs[name]["batch_timeout_ms"]) * 1000),
                "instances": int(knobs[name]["concurrency"]),
                "intra_op_threads": int(knobs[name]["intra_op_threads"]),
                "inter_op_threads": int(knobs[name]["inter_op_threads"]),
            }
            for name, model in models.items()
        ],
    }
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return config


# PyTriton 0.7.0 races with itself when a model has two or more instances: Triton's Python
# backend initialises them in parallel, and an instance that asks the first one for its
# configuration between that socket's bind and its listen is refused, which fails the model's
# whole load (seen once in a suite run on a busy machine). A fresh start is a fresh draw, so
# that failure, and only that one, is retried, a bounded number of times.
TRITON_START_ATTEMPTS = 3
HANDSHAKE_RACE = "get_config_from_handshake_server"


def start_triton(
    env: PeerEnv,
    folder: Path,
    models: Mapping[str, Model],
    knobs: Mapping[str, Mapping[str, Any]],
    timeout_s: float,
) -> tuple[ServerProcess, str, dict[str, Any]]:
    """Triton through ``triton_server`` in its environment, every model ready: the process,
    its base URL and its configuration. A start lost to PyTriton's instance handshake race is
    retried (``TRITON_START_ATTEMPTS`` in all) in a fresh workspace, with the lost one's log
    kept beside it."""
    for attempt in range(1, TRITON_START_ATTEMPTS + 1):
        try:
            return _start_triton_once(env, folder, models, knobs, timeout_s)
        except RuntimeError as exc:
            if HANDSHAKE_RACE not in str(exc) or attempt == TRITON_START_ATTEMPTS:
                raise
            lost = folder.parent / f"triton-lost-start-{attempt}.log"
            (folder.parent / "triton.log").replace(lost)
            shutil.rmtree(folder / "workspace", ignore_errors=True)
            print(
                f"Triton lost its instance handshake race (start {attempt} of "
                f"{TRITON_START_ATTEMPTS}, log {lost}); starting it again",
                file=sys.stderr,
                flush=True,
            )
    raise AssertionError("unreachable: the last attempt returns or raises")


def _start_triton_once(
    env: PeerEnv,
    folder: Path,
    models: Mapping[str, Model],
    knobs: Mapping[str, Mapping[str, Any]],
    timeout_s: float,
) -> tuple[ServerProcess, str, dict[str, Any]]:
    config = write_triton_config(folder, models, knobs)
    environ = clean_env()
    # The Python backend's stub loads libpython from the loader's path (peer_env).
    libdir = interpreter_libdir()
    old = environ.get("LD_LIBRARY_PATH")
    environ["LD_LIBRARY_PATH"] = f"{libdir}:{old}" if old else libdir
    argv = [str(env.python), str(TRITON_SCRIPT), str(folder / "config.json")]
    server = InterruptedProcess(argv, log_path=folder.parent / "triton.log", env=environ)
    base = f"http://{HOST}:{config['http_port']}"
    _wait_models_ready(server, base, list(models), timeout_s, "Triton")
    return server, base, config


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


class InterruptedProcess(ServerProcess):
    """Triton stops on SIGINT to PyTriton's process alone, which then stops ``tritonserver``
    and its Python backend stubs in order (a signal to the whole group would hit them all at
    once); ``ServerProcess.stop`` then for whatever is left."""

    def stop(self, timeout_s: float = 20.0) -> int | None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout_s)
        return super().stop(10.0)


def _wait_models_ready(
    server: ServerProcess, base: str, names: list[str], timeout_s: float, label: str
) -> None:
    """Return once every model answers ready; otherwise (the server exited, the time ran out,
    an interrupt) stop the server and raise."""
    try:
        _poll_models_ready(server, base, names, timeout_s, label)
    except BaseException:
        server.stop()
        raise


def _poll_models_ready(
    server: ServerProcess, base: str, names: list[str], timeout_s: float, label: str
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
            raise RuntimeError(f"{label} did not get ready:\n{server.log_text()[-4000:]}")
        time.sleep(0.1)
