"""Where each node of a model really ran: ONNX Runtime's profile names the execution provider of
every node it ran, TensorFlow's full trace the device of every op. What the tests of tests/gpu
assert on (a session's ``get_providers()`` lists what it may use, not what each node used)."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np


def onnx_node_providers(
    model: str | bytes, providers: Sequence[str], feed: Mapping[str, np.ndarray]
) -> dict[str, tuple[str, str]]:
    """Node name -> (op type, execution provider) for one profiled run of ``model``."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="iotgw-profile-") as folder:
        options = ort.SessionOptions()
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(folder) / "run")
        session = ort.InferenceSession(model, sess_options=options, providers=list(providers))
        session.run(None, dict(feed))
        events: list[dict[str, Any]] = json.loads(Path(session.end_profiling()).read_text())
    nodes: dict[str, tuple[str, str]] = {}
    for event in events:
        args = event.get("args", {})
        if event.get("cat") == "Node" and "provider" in args:
            name = str(event["name"]).removesuffix("_kernel_time")
            nodes[name] = (str(args.get("op_name", "")), str(args["provider"]))
    return nodes


def tf_op_devices(session: Any, fetch: str, feed: Mapping[str, np.ndarray]) -> dict[str, str]:
    """Op name -> device of one fully traced run of ``fetch`` in a ``tf.compat.v1.Session``."""
    from models import tf_env  # noqa: F401  isort: skip
    import tensorflow as tf

    options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    metadata = tf.compat.v1.RunMetadata()
    session.run(fetch, feed_dict=dict(feed), options=options, run_metadata=metadata)
    devices: dict[str, str] = {}
    for device in metadata.step_stats.dev_stats:
        if "/stream:" in device.device or "/memcpy" in device.device:
            continue  # the GPU's stream view repeats its kernels; copies are no ops of the model
        for node in device.node_stats:
            devices.setdefault(node.node_name, device.device)
    return devices
