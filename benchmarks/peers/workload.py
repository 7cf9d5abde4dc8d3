"""The requests the peers benchmark sends (pre-encoded once: OIP JSON for both servers, the binary
tensor extension for the gateway beside it) and the check that every server answers what the
runtime computes before anything is timed."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from benchmarks.http import workload as http_workload
from benchmarks.http.workload import Model
from benchmarks.peers.plan import REQUEST_BUDGET_S


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
    """``benchmarks.http.workload.reply_difference`` for one of these requests."""
    return http_workload.reply_difference(
        url, model, request.body, request.header_length, _rows(model, request.rows)
    )
