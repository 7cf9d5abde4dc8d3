"""An ONNX Runtime inference runtime for MLServer, the peer the gateway is measured against.

This module runs inside MLServer's own virtual environment (``benchmarks.peers.peer_env``),
copied next to each model's ``model-settings.json``: it imports only MLServer, NumPy and ONNX
Runtime, nothing of this project. MLServer ships no ONNX runtime of its own, so this is the
~40-line runtime its documentation asks for (``load`` and ``predict``), written the way its
bundled runtimes (``mlserver-sklearn``, ``mlserver-xgboost``) are: the session is called in
``predict`` directly, in the inference worker process MLServer runs it in.

The session is set up as the gateway's ONNX Runtime backend sets up its own
(``models.backends.onnx_backend.session_options``, repeated here because this module cannot import
the project): the same intra- and inter-op threads, sequential execution with one inter-op
thread, every graph optimization, and no busy-waiting of idle pool threads.
"""

from __future__ import annotations

from typing import Any

import onnxruntime as ort
from mlserver import MLModel  # type: ignore[import-not-found]
from mlserver.codecs import NumpyCodec  # type: ignore[import-not-found]
from mlserver.types import InferenceRequest, InferenceResponse  # type: ignore[import-not-found]
from mlserver.utils import get_model_uri  # type: ignore[import-not-found]


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


class OnnxRuntimeModel(MLModel):
    """One ONNX file (``parameters.uri``) served on ONNX Runtime's CPU provider; threads from
    ``parameters.extra`` (``intra_op_threads``, ``inter_op_threads``)."""

    async def load(self) -> bool:
        extra: dict[str, Any] = dict(self.settings.parameters.extra or {})
        opts = session_options(
            int(extra.get("intra_op_threads", 1)), int(extra.get("inter_op_threads", 1))
        )
        path = await get_model_uri(self.settings)
        self._session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        self._output_names = [o.name for o in self._session.get_outputs()]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        feeds = {i.name: NumpyCodec.decode_input(i) for i in payload.inputs}
        results = self._session.run(self._output_names, feeds)
        return InferenceResponse(
            id=payload.id,
            model_name=self.name,
            model_version=self.version,
            outputs=[
                NumpyCodec.encode_output(name, value)
                for name, value in zip(self._output_names, results, strict=True)
            ],
        )
