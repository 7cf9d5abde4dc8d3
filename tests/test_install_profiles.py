"""Install profiles: the base install serves ONNX models; TensorFlow, onnx, SciPy, scikit-learn
and matplotlib come with extras, and what needs a missing one says which extra to install.

A fresh virtual environment per test would take minutes, so the gateway runs as a process in
which those packages cannot be imported (``tests.without_packages``: the interpreter's own import
blocker), which goes through the same code paths as an install without them.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement

from tests.brokers import free_port
from tests.gateway.helpers import make_repo

ROOT = Path(__file__).resolve().parents[1]
# What the base install leaves out (import names).
OPTIONAL = "tensorflow,keras,onnx,scipy,sklearn,matplotlib,threadpoolctl,hypothesis"
DEADLINE_S = 120.0


def _project() -> dict[str, Any]:
    with (ROOT / "pyproject.toml").open("rb") as fh:
        project: dict[str, Any] = tomllib.load(fh)["project"]
    return project


def _applies(requirement: str, machine: str, extra: str = "") -> str | None:
    """The distribution ``requirement`` installs on Linux ``machine``, or None."""
    req = Requirement(requirement)
    env = {k: str(v) for k, v in default_environment().items()}
    env.update(platform_machine=machine, sys_platform="linux", extra=extra)
    if req.marker is None or req.marker.evaluate(env):
        return req.name
    return None


def test_base_dependencies_leave_out_the_heavy_packages() -> None:
    base = {Requirement(r).name for r in _project()["dependencies"]}
    assert {"onnxruntime", "aiohttp", "aiomqtt", "safetensors"} <= base
    heavy = {"tensorflow", "tensorflow-cpu", "onnx", "scipy", "scikit-learn", "matplotlib"}
    assert not base & heavy


@pytest.mark.parametrize(
    ("machine", "wheel"), [("x86_64", "tensorflow-cpu"), ("aarch64", "tensorflow")]
)
def test_tf_extra_picks_a_wheel_that_exists_on_the_machine(machine: str, wheel: str) -> None:
    """tensorflow-cpu has x86_64 wheels only: arm64 (the CPU image on arm64) gets tensorflow."""
    chosen = [_applies(r, machine, "tf") for r in _project()["optional-dependencies"]["tf"]]
    assert [c for c in chosen if c] == [wheel]


def test_gpu_extra_is_one_cuda_for_both_backends() -> None:
    gpu = [Requirement(r) for r in _project()["optional-dependencies"]["gpu"]]
    ort = next(r for r in gpu if r.name == "onnxruntime-gpu")
    # 1.27 and later are CUDA 13 builds; TensorFlow 2.21 loads CUDA 12.
    assert not ort.specifier.contains("1.27.0") and ort.specifier.contains("1.26.0")
    assert {"cuda", "cudnn"} <= ort.extras
    linux_tf = [r for r in gpu if r.name == "tensorflow" and "and-cuda" in r.extras]
    assert linux_tf


def test_test_extra_installs_every_feature() -> None:
    test = [Requirement(r) for r in _project()["optional-dependencies"]["test"]]
    own = next(r for r in test if r.name == "iotgw")
    assert {"demo", "bench"} <= own.extras


@pytest.fixture
def two_runtimes(demo_repo: Path, tmp_path: Path) -> Path:
    """One ONNX model and one TensorFlow model; the TensorFlow one is not required, so the
    gateway is ready without it where TensorFlow is not installed."""
    return make_repo(
        tmp_path / "repo",
        demo_repo,
        {"sensor_mlp": None, "sensor_mlp_tf": {"required": False}},
    )


def _start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "tests.without_packages", OPTIONAL, "--", *argv]
    # The tuner on, as by default: without SciPy and scikit-learn it must step aside, not crash.
    env = {**os.environ, "IOTGW_TUNER__ENABLED": "true"}
    with log.open("wb") as out:
        return subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env)


@contextlib.contextmanager
def _serving(repo: Path, folder: Path) -> Iterator[tuple[str, Path]]:
    port = free_port()
    log = folder / "serve.log"
    argv = ["serve", "--model-repo", str(repo), "--cache-dir", str(folder)]
    proc = _start([*argv, "--http-port", str(port), "--no-mqtt"], log)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, proc, log)
        yield url, log
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"gateway exited with {proc.returncode}:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.HTTPError, OSError):
            pass
        time.sleep(0.1)
    raise AssertionError(f"gateway not ready in {DEADLINE_S} s:\n{log.read_text()}")


def _post(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _settled_index(url: str) -> dict[str, Any]:
    """The repository index once no model is still loading: ready means the gateway serves,
    and a model whose runtime is missing may still be on its way to UNAVAILABLE."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        status, index = _post(f"{url}/v2/repository/index", {})
        assert status == 200, index
        states = {m["name"]: m for m in index}
        if all(m["state"] != "LOADING" for m in index) or time.monotonic() > deadline:
            return states
        time.sleep(0.1)


@pytest.mark.slow
def test_base_install_serves_onnx_and_names_the_missing_extras(
    two_runtimes: Path, tmp_path: Path
) -> None:
    with _serving(two_runtimes, tmp_path) as (url, log):
        states = _settled_index(url)
        assert states["sensor_mlp"]["state"] == "READY"
        tf_model = states["sensor_mlp_tf"]
        assert tf_model["state"] == "UNAVAILABLE"
        assert tf_model["reason"].endswith(
            "TensorFlow is not installed: install the iotgw[tf] extra (pip install '.[tf]' in "
            "the iotgw source folder)"
        )
        features = {"name": "features", "datatype": "FP32", "shape": [2, 32], "data": [0.1] * 64}
        status, reply = _post(f"{url}/v2/models/sensor_mlp/infer", {"inputs": [features]})
        assert status == 200 and reply["outputs"][0]["shape"] == [2, 8]
        status, reply = _post(f"{url}/v2/models/sensor_mlp_tf/infer", {"inputs": [features]})
        assert status == 503 and "iotgw[tf]" in json.dumps(reply)
        text = log.read_text()
    assert "tuner: off, serving the configured knobs" in text
    assert "pip install '.[tune]'" in text


def test_bundled_demo_without_its_extras_says_which_to_install(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    argv = ["serve", "--cache-dir", str(tmp_path), "--http-port", "0", "--no-mqtt"]
    proc = _start(argv, log)
    assert proc.wait(timeout=DEADLINE_S) != 0
    assert "pip install '.[demo]'" in log.read_text()
