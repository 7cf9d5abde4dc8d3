"""The requests the peers benchmark sends (pre-encoded once: OIP JSON for both servers, the binary
tensor extension for the gateway beside it) and the check that every server answers what the
runtime computes before anything is timed."""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass

import numpy as np

from benchmarks.http.workload import Model
from benchmarks.loadgen import decode_response
from benchmarks.peers.plan import REQUEST_BUDGET_S
from gateway.codecs.oip import HEADER_LENGTH

# Largest difference accepted between a server's reply and the runtime called in this process:
# JSON carries float32 values as text, and batches of different sizes may round differently.
TOLERANCE = 1e-4


@dataclass(frozen=True, slots=True)
class Request:
    """One request, encoded once: ``header_length`` 0 is plain JSON (``loadgen.LoadJob``)."""

    body: bytes
    header_length: int
    rows: int


def json_request(model: Model, rows: int) -> Request:
    """An OIP JSON request of ``rows`` rows, the data flat in row-major order (as the Open
    Inference Protocol allows and both servers read), with the benchmark's time budget."""
    x = _rows(model, rows)
    tensor = {"name": model.input_name, "shape": list(x.shape), "datatype": "FP32"}
    doc = {
        "inputs": [{**tensor, "data": x.ravel().tolist()}],
        "parameters": {"timeout": int(REQUEST_BUDGET_S * 1e6)},
    }
    return Request(json.dumps(doc, separators=(",", ":")).encode(), 0, rows)


def binary_request(model: Model, rows: int) -> Request:
    """The same rows and budget in the binary tensor extension (JSON header, then the raw
    little-endian FP32 data), with binary outputs asked for."""
    x = np.ascontiguousarray(_rows(model, rows), dtype="<f4")
    tensor = {"name": model.input_name, "shape": list(x.shape), "datatype": "FP32"}
    header = {
        "inputs": [{**tensor, "parameters": {"binary_data_size": x.nbytes}}],
        "parameters": {"binary_data_output": True, "timeout": int(REQUEST_BUDGET_S * 1e6)},
    }
    head = json.dumps(header, separators=(",", ":")).encode()
    return Request(head + x.tobytes(), len(head), rows)


def _rows(model: Model, rows: int) -> np.ndarray:
    return model.inputs(rows, seed=42)[model.input_name]


def reply_difference(url: str, model: Model, request: Request) -> float:
    """Largest absolute difference between one reply of the server at ``url`` and the runtime
    called in this process on the same rows; raises when the reply is wrong."""
    from models.backends import load_runtime
    from models.runtime import Threads

    headers = {"Content-Type": "application/json"}
    if request.header_length:
        headers = {
            "Content-Type": "application/octet-stream",
            HEADER_LENGTH: str(request.header_length),
        }
    req = urllib.request.Request(url, data=request.body, method="POST", headers=headers)
    with urllib.request.urlopen(req, timeout=60) as resp:
        length = resp.headers.get(HEADER_LENGTH)
        got = decode_response(resp.read(), int(length) if length else None)
    rt = load_runtime(model.version, Threads(1, 1))
    want = rt.infer({model.input_name: _rows(model, request.rows)})
    rt.close()
    worst = 0.0
    for name in model.output_names:
        if got[name].shape != want[name].shape:
            raise AssertionError(f"{url}: {name} shape {got[name].shape} != {want[name].shape}")
        worst = max(worst, float(np.max(np.abs(got[name] - want[name]))))
    if worst > TOLERANCE:
        raise AssertionError(f"{url}: the reply differs from the runtime's by {worst}")
    return worst
