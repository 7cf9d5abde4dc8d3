"""``iotgw serve`` with no repository given serves the bundled demo repository, and with it
the int8 and int4 checkpoints of every demo model on both runtimes, next to the fp32 ones."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from models.backends import load_runtime
from models.demo import DEMO_MODELS, QUANTIZED_DEMO_MODELS
from models.repository import ModelVersion, with_plan_defaults
from models.runtime import Threads

pytestmark = pytest.mark.slow

_READY_LINE = re.compile(r"ready: http://127\.0\.0\.1:(\d+)/v2")


@pytest.fixture(scope="module")
def default_gateway(
    full_demo_repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """``iotgw serve`` without ``--model-repo``: the cache folder of ``full_demo_repo`` already
    holds the default repository, so the gateway finds it complete and serves it."""
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    argv = [sys.executable, "-m", "gateway.cli", "serve", "--host", "127.0.0.1", "--http-port", "0"]
    argv += ["--cache-dir", str(full_demo_repo.parent), "--no-mqtt"]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "IOTGW_LOG_LEVEL": "INFO"},
        )
    try:
        give_up = time.monotonic() + 180  # a bound on start-up, not an assertion on its speed
        while True:
            text = log_path.read_text(errors="replace")
            match = _READY_LINE.search(text)
            if match:
                break
            if proc.poll() is not None or time.monotonic() > give_up:
                pytest.fail(f"iotgw serve did not become ready (exit {proc.poll()}):\n{text}")
            time.sleep(0.1)
        assert f"serving the bundled demo repository at {full_demo_repo}" in text
        yield f"http://127.0.0.1:{match.group(1)}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _request(url: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="GET" if body is None else "POST")
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.loads(reply.read())


def test_every_demo_model_is_ready(default_gateway: str) -> None:
    index = _request(f"{default_gateway}/v2/repository/index", {})
    assert sorted((e["name"], e["state"]) for e in index) == sorted(
        (m.name, "READY") for m in DEMO_MODELS
    )


@pytest.mark.parametrize("name", [m.name for m in QUANTIZED_DEMO_MODELS])
def test_quantized_models_answer_like_their_runtime(
    name: str,
    default_gateway: str,
    demo_versions: dict[str, ModelVersion],
    full_demo_repo: Path,
) -> None:
    version = demo_versions[name]
    meta = _request(f"{default_gateway}/v2/models/{name}")
    assert meta["platform"] == (
        "tensorflow_savedmodel" if name.endswith("_tf") else "onnxruntime_onnx"
    )
    rng = np.random.default_rng(len(name))
    inputs = {
        i["name"]: rng.standard_normal((3, *i["shape"][1:])).astype(np.float32)
        for i in meta["inputs"]
    }
    body = {
        "inputs": [
            {"name": k, "shape": list(v.shape), "datatype": "FP32", "data": v.ravel().tolist()}
            for k, v in inputs.items()
        ]
    }
    reply = _request(f"{default_gateway}/v2/models/{name}/infer", body)
    (output,) = reply["outputs"]
    got = np.asarray(output["data"], np.float32).reshape(output["shape"])
    # The reference session reads the plan the gateway chose (its cache folder): timings
    # measured here, under other load, must not make it run another way.
    version = with_plan_defaults(
        version, weight_memory_budget=0.5, plan_cache_dir=full_demo_repo.parent / "plans"
    )
    runtime = load_runtime(version, Threads(1, 1))
    try:
        plan = runtime.metadata.serving_plan
        assert plan is None or plan.kept, plan.summary()
        expected = runtime.infer(inputs)[output["name"]]
    finally:
        runtime.close()
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)
    assert np.allclose(got.sum(axis=1), 1.0, atol=1e-5)  # softmax rows


@pytest.mark.parametrize("name", ["vision_cnn_int4", "vision_cnn_int4_tf", "vision_cnn"])
def test_model_config_shows_the_serving_plan(name: str, default_gateway: str) -> None:
    """``/v2/models/{m}/config`` carries how each quantized tensor runs, as ``iotgw inspect
    --plan`` prints it; a float model has none."""
    config = _request(f"{default_gateway}/v2/models/{name}/config")
    plan = config["serving_plan"]
    if name == "vision_cnn":
        assert plan is None
        return
    assert plan["runtime"] == ("tensorflow" if name.endswith("_tf") else "onnxruntime")
    assert plan["budget"] == 0.5  # the serve default
    ways = {t["way"] for t in plan["tensors"]}
    assert ways and ways <= {"packed", "graph", "load"}
