"""Helpers of the gateway tests: repositories derived from the demo one, in-process gateways,
direct runtime calls to compare against, and Open Inference Protocol bodies built by hand."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import AsyncIterator, Iterable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from gateway.main import Gateway
from gateway.settings.schema import GatewaySettings
from models.backends import load_runtime
from models.demo import config_toml
from models.repository import CONFIG_FILE, ModelConfig, ModelVersion, read_config, scan_repository
from models.runtime import ModelMetadata, Runtime, Threads

HEADER_LENGTH = "Inference-Header-Content-Length"
# A request deadline (Open Inference Protocol ``timeout`` parameter, in microseconds) that no
# test means to hit: 10 s. Tests that are not about deadlines send it so that a slow CI machine
# never turns a correct answer into a 503.
GENEROUS_TIMEOUT_US = 10_000_000

# -- repositories ------------------------------------------------------------------------------


def make_repo(
    dest: Path,
    demo_repo: Path,
    models: Mapping[str, Mapping[str, Any] | None],
) -> Path:
    """A repository at ``dest`` holding ``models`` of the demo repository (version 1), each with
    its config.toml updated by the given overrides (``{"batching": {...}}`` is merged key by
    key). The model files are symlinked, so this costs no export."""
    dest.mkdir(parents=True, exist_ok=True)
    for name, overrides in models.items():
        src = demo_repo / name / "1"
        config = read_config(src / CONFIG_FILE)
        doc = config.model_dump()
        for key, value in (overrides or {}).items():
            if isinstance(value, Mapping):
                doc[key] = {**doc[key], **value}
            else:
                doc[key] = value
        new = ModelConfig.model_validate(doc)
        target = dest / name / "1"
        target.mkdir(parents=True)
        (target / config.path).symlink_to(src / config.path)
        (target / CONFIG_FILE).write_text(config_toml(new), encoding="utf-8")
    return dest


def settings_for(repo: Path, cache_dir: Path, **http: Any) -> GatewaySettings:
    return GatewaySettings.load(
        http={"port": 0, "host": "127.0.0.1", **http},
        serving={"model_repo": repo, "cache_dir": cache_dir},
        mqtt={"enabled": False},  # HTTP tests; the MQTT tests start their own broker
    )


@contextlib.asynccontextmanager
async def running_gateway(repo: Path, cache_dir: Path, **http: Any) -> AsyncIterator[Gateway]:
    """An in-process gateway on 127.0.0.1 (a free port) with every model loaded."""
    gw = Gateway(settings_for(repo, cache_dir, **http))
    await gw.start(wait_ready=True)
    try:
        yield gw
    finally:
        await gw.stop()


def base_url(gw: Gateway) -> str:
    return f"http://127.0.0.1:{gw.http_port}"


# -- direct runtime calls ----------------------------------------------------------------------


class Reference:
    """Direct calls of the backends, outside the gateway: one runtime per model version of a
    repository, opened with ``models.backends.load_runtime`` on the same ``ModelVersion``."""

    def __init__(self, repo: Path) -> None:
        self._versions = {v.name: v for v in scan_repository(repo) if isinstance(v, ModelVersion)}
        self._runtimes: dict[str, Runtime] = {}
        self._lock = threading.Lock()  # a runtime is used from one thread at a time

    def runtime(self, model: str) -> Runtime:
        with self._lock:
            if model not in self._runtimes:
                self._runtimes[model] = load_runtime(self._versions[model], Threads(1, 1))
            return self._runtimes[model]

    def metadata(self, model: str) -> ModelMetadata:
        return self.runtime(model).metadata

    def infer(self, model: str, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        runtime = self.runtime(model)
        with self._lock:
            return runtime.infer(dict(inputs))

    def close(self) -> None:
        with self._lock:
            for runtime in self._runtimes.values():
                runtime.close()
            self._runtimes.clear()


def random_inputs(
    metadata: ModelMetadata, rows: int, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Standard-normal float32 inputs of ``rows`` rows for every input of the model."""
    return {
        spec.name: rng.standard_normal((rows, *spec.shape[1:])).astype(np.float32)
        for spec in metadata.inputs
    }


# -- Open Inference Protocol bodies ------------------------------------------------------------


def json_request(
    inputs: Mapping[str, np.ndarray],
    *,
    id: str | None = None,
    timeout_us: int | None = GENEROUS_TIMEOUT_US,
    outputs: Iterable[str] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "inputs": [
            {
                "name": name,
                "datatype": "FP32",
                "shape": list(arr.shape),
                "data": arr.ravel().tolist(),
            }
            for name, arr in inputs.items()
        ]
    }
    if id is not None:
        body["id"] = id
    if timeout_us is not None:
        body["parameters"] = {"timeout": timeout_us}
    if outputs is not None:
        body["outputs"] = [{"name": n} for n in outputs]
    return body


def binary_request(
    inputs: Mapping[str, np.ndarray],
    *,
    timeout_us: int | None = GENEROUS_TIMEOUT_US,
    binary_output: bool = True,
    datatype: str = "FP32",
) -> tuple[bytes, dict[str, str]]:
    """A binary-tensor request body and its headers (raw little-endian tensors after the JSON)."""
    header: dict[str, Any] = {
        "inputs": [
            {
                "name": name,
                "datatype": datatype,
                "shape": list(arr.shape),
                "parameters": {"binary_data_size": arr.nbytes},
            }
            for name, arr in inputs.items()
        ],
        "parameters": {"binary_data_output": binary_output},
    }
    if timeout_us is not None:
        header["parameters"]["timeout"] = timeout_us
    head = json.dumps(header).encode()
    raw = b"".join(
        np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<")).tobytes() for a in inputs.values()
    )
    return head + raw, {
        HEADER_LENGTH: str(len(head)),
        "Content-Type": "application/octet-stream",
    }


def decode_response(body: bytes, headers: Mapping[str, str]) -> dict[str, np.ndarray]:
    """The outputs of an Open Inference Protocol reply, JSON or binary."""
    length = headers.get(HEADER_LENGTH)
    head = json.loads(body if length is None else body[: int(length)])
    binary = b"" if length is None else body[int(length) :]
    dtypes = {"FP32": np.float32, "FP64": np.float64, "INT64": np.int64, "INT32": np.int32}
    out: dict[str, np.ndarray] = {}
    offset = 0
    for entry in head["outputs"]:
        dtype = np.dtype(dtypes[entry["datatype"]])
        size = entry.get("parameters", {}).get("binary_data_size")
        if size is None:
            arr = np.asarray(entry["data"], dtype=dtype)
        else:
            arr = np.frombuffer(binary[offset : offset + size], dtype=dtype.newbyteorder("<"))
            offset += size
        out[entry["name"]] = arr.astype(dtype).reshape(entry["shape"])
    return out


async def infer_binary(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    inputs: Mapping[str, np.ndarray],
    *,
    timeout_us: int | None = GENEROUS_TIMEOUT_US,
) -> tuple[int, dict[str, np.ndarray] | str, Mapping[str, str]]:
    """POST one binary-tensor request; returns (status, outputs or error text, headers)."""
    body, headers = binary_request(inputs, timeout_us=timeout_us)
    async with session.post(f"{url}/v2/models/{model}/infer", data=body, headers=headers) as r:
        raw = await r.read()
        if r.status != 200:
            return r.status, raw.decode(errors="replace"), r.headers
        return r.status, decode_response(raw, r.headers), r.headers


def metric_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(sample name, labels, value) of every sample of a Prometheus text exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    return [
        (s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]
