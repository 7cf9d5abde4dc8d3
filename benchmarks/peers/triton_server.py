"""Triton Inference Server (through PyTriton) serving ONNX files on ONNX Runtime: the second
peer the gateway is measured against.

Run as a script inside Triton's own virtual environment (``benchmarks.peers.peer_env``):
``python triton_server.py CONFIG.json``. It imports only PyTriton, NumPy and ONNX Runtime,
nothing of this project. PyTriton starts a real ``tritonserver`` (its C++ HTTP and gRPC front
ends and its dynamic batcher) and binds one Python callable per model instance; each callable
runs its own ONNX Runtime session, set up as the gateway's ONNX Runtime backend sets up its own
(``models.backends.onnx_backend.session_options``, repeated here because this module cannot
import the project): the same intra- and inter-op threads, sequential execution with one
inter-op thread, every graph optimization, no busy-waiting of idle pool threads.

The bound tensors carry the ONNX file's own input and output names, so one OIP JSON body
serves the gateway, MLServer and Triton alike.

CONFIG.json: ``{"host", "http_port", "grpc_port", "metrics_port", "workspace", "models": [{
"name", "path", "max_batch_size", "max_queue_delay_us", "instances", "intra_op_threads",
"inter_op_threads"}]}``. It serves until SIGINT or SIGTERM.
"""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from pytriton.decorators import batch  # type: ignore[import-not-found]
from pytriton.model_config import (  # type: ignore[import-not-found]
    DynamicBatcher,
    ModelConfig,
    Tensor,
)
from pytriton.triton import Triton, TritonConfig  # type: ignore[import-not-found]

# ONNX element types of the tensors these models have, as NumPy dtypes for the binding.
DTYPES = {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(int32)": np.int32}


def session_options(intra_op: int, inter_op: int) -> ort.SessionOptions:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = intra_op
    opts.inter_op_num_threads = inter_op
    opts.execution_mode = (
        ort.ExecutionMode.ORT_PARALLEL if inter_op > 1 else ort.ExecutionMode.ORT_SEQUENTIAL
    )
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return opts


def _tensors(args: list[Any]) -> list[Any]:
    """PyTriton's tensor specs of a session's inputs or outputs: the ONNX names, the shape
    without the batch dimension (Triton adds it where ``max_batch_size`` > 0)."""
    out = []
    for a in args:
        if a.type not in DTYPES:
            raise SystemExit(f"{a.name}: element type {a.type} is not served here")
        shape = tuple(d if isinstance(d, int) else -1 for d in a.shape[1:])
        out.append(Tensor(name=a.name, dtype=DTYPES[a.type], shape=shape))
    return out


def infer_callable(session: ort.InferenceSession) -> Callable[..., dict[str, np.ndarray]]:
    """One model instance: Triton's batch (every input stacked along the first axis by the
    ``batch`` decorator) through the session, each output by its name."""
    names = [o.name for o in session.get_outputs()]

    @batch
    def infer(**inputs: np.ndarray) -> dict[str, np.ndarray]:
        return dict(zip(names, session.run(names, inputs), strict=True))

    return infer


def bind_model(triton: Any, spec: dict[str, Any]) -> None:
    opts = session_options(int(spec["intra_op_threads"]), int(spec["inter_op_threads"]))
    sessions = [
        ort.InferenceSession(spec["path"], opts, providers=["CPUExecutionProvider"])
        for _ in range(int(spec["instances"]))
    ]
    batcher = DynamicBatcher(max_queue_delay_microseconds=int(spec["max_queue_delay_us"]))
    triton.bind(
        model_name=spec["name"],
        infer_func=[infer_callable(s) for s in sessions],  # a list: one instance per callable
        inputs=_tensors(sessions[0].get_inputs()),
        outputs=_tensors(sessions[0].get_outputs()),
        config=ModelConfig(max_batch_size=int(spec["max_batch_size"]), batcher=batcher),
        strict=True,
    )


def main(config_path: str) -> None:
    config = json.loads(Path(config_path).read_text())
    triton_config = TritonConfig(
        http_address=config["host"],
        http_port=int(config["http_port"]),
        grpc_address=config["host"],
        grpc_port=int(config["grpc_port"]),
        metrics_address=config["host"],
        metrics_port=int(config["metrics_port"]),
        log_verbose=0,
        exit_timeout_secs=5,  # at stop, how long it waits for requests in flight
    )
    # SIGTERM as SIGINT: ``serve`` stops Triton and its Python backends cleanly on either.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with Triton(config=triton_config, workspace=config["workspace"]) as triton:
        for spec in config["models"]:
            bind_model(triton, spec)
        print("triton serving", flush=True)
        triton.serve()


if __name__ == "__main__":
    main(sys.argv[1])
