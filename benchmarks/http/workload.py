"""The models the HTTP benchmark measures, each with the one request it is sent (one row,
binary tensor framing, encoded once), and the check that the gateway answers what the runtime
computes."""

from __future__ import annotations

import math
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.http.plan import MODELS, Plan
from benchmarks.loadgen import decode_response, encode_request
from gateway.codecs.oip import HEADER_LENGTH

# Largest difference accepted between a server's reply and the runtime called in this process:
# JSON carries float32 values as text, and batches of different sizes may round differently.
TOLERANCE = 1e-4


@dataclass
class Model:
    name: str
    version: Any  # models.repository.ModelVersion
    input_name: str
    row_shape: tuple[int, ...]
    output_names: tuple[str, ...]
    max_batch_size: int
    slo_ms: float
    default_timeout_ms: float
    body: bytes = b""
    header_length: int = 0
    row: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))

    def inputs(self, rows: int, seed: int = 0) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((rows, *self.row_shape)).astype(np.float32)
        return {self.input_name: x}

    def batch_sizes(self, plan: Plan) -> list[int]:
        if plan.batch_sizes is not None:
            return [b for b in plan.batch_sizes if b <= self.max_batch_size]
        sizes = [2**i for i in range(int(math.log2(self.max_batch_size)) + 1)]
        if sizes[-1] != self.max_batch_size:
            sizes.append(self.max_batch_size)
        return sizes

    def url(self, base: str) -> str:
        return f"{base}/v2/models/{self.name}/versions/1/infer"


def build_repository(dest: Path) -> Path:
    """The demo repository's ``sensor_mlp`` and ``vision_cnn`` (same weights and configs as
    ``models.demo``), without the TensorFlow twins: serving those would load TensorFlow into
    the gateway, which costs memory and start-up time and has nothing to do with this figure."""
    from models.demo import DEMO_MODELS, VERSION, write_model_version

    for demo in DEMO_MODELS:
        if demo.name in MODELS:
            write_model_version(demo, dest / demo.name / str(VERSION))
    return dest


def load_models(repo: Path) -> dict[str, Model]:
    from models.repository import ModelVersion, scan_repository

    out: dict[str, Model] = {}
    for v in scan_repository(repo):
        if not isinstance(v, ModelVersion):
            raise RuntimeError(f"benchmark repository is broken: {v}")
        out[v.name] = _model(v)
    return {name: out[name] for name in MODELS}


def _model(version: Any) -> Model:
    """The model of ``version`` (read from a runtime's metadata) and its request."""
    from models.backends import load_runtime
    from models.runtime import Threads

    rt = load_runtime(version, Threads(1, 1))
    md = rt.metadata
    rt.close()
    (inp,) = md.inputs
    if inp.dtype != "float32":
        raise RuntimeError(f"{version.name}: the benchmark sends FP32, the model wants {inp.dtype}")
    model = Model(
        name=version.name,
        version=version,
        input_name=inp.name,
        row_shape=tuple(inp.shape[1:]),
        output_names=tuple(o.name for o in md.outputs),
        max_batch_size=version.config.max_batch_size,
        slo_ms=version.config.slo_ms,
        default_timeout_ms=version.config.batching.batch_timeout_ms,
    )
    model.row = model.inputs(1, seed=42)[model.input_name]
    model.body, model.header_length = encode_request(model.input_name, model.row)
    return model


def check_replies(base: str, models: dict[str, Model]) -> dict[str, float]:
    """The gateway answers what the runtime computes (one request per model): the largest
    absolute difference per model."""
    return {
        m.name: reply_difference(m.url(base), m, m.body, m.header_length, m.row)
        for m in models.values()
    }


def reply_difference(
    url: str, model: Model, body: bytes, header_length: int, rows: np.ndarray
) -> float:
    """Largest absolute difference between the reply of the server at ``url`` to ``body`` (the
    binary tensor extension when ``header_length`` is set, else plain JSON) and the runtime
    called in this process on ``rows``; raises when the reply is wrong."""
    from models.backends import load_runtime
    from models.runtime import Threads

    headers = {"Content-Type": "application/json"}
    if header_length:
        headers = {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(header_length)}
    req = urllib.request.Request(url, data=body, method="POST", headers=headers)
    with urllib.request.urlopen(req, timeout=60) as resp:
        length = resp.headers.get(HEADER_LENGTH)
        got = decode_response(resp.read(), int(length) if length else None)
    rt = load_runtime(model.version, Threads(1, 1))
    want = rt.infer({model.input_name: rows})
    rt.close()
    worst = 0.0
    for name in model.output_names:
        if got[name].shape != want[name].shape:
            raise AssertionError(f"{url}: {name} shape {got[name].shape} != {want[name].shape}")
        worst = max(worst, float(np.max(np.abs(got[name] - want[name]))))
    if worst > TOLERANCE:
        raise AssertionError(f"{url}: the reply differs from the runtime's by {worst}")
    return worst
