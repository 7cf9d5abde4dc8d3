"""Metadata of non-float and string tensors, with small models built here for the purpose."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from models.backends import load_runtime
from models.repository import ModelConfig, ModelVersion
from models.runtime import TensorSpec, Threads


def _version(directory: Path, runtime: str, path: str) -> ModelVersion:
    config = ModelConfig.model_validate({"runtime": runtime, "path": path})
    return ModelVersion("typed", 3, directory, config)


def test_onnx_string_int_and_symbolic_dims(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [
            helper.make_node("Identity", ["text"], ["text_out"]),
            helper.make_node("Identity", ["ids"], ["ids_out"]),
        ],
        "typed",
        inputs=[
            helper.make_tensor_value_info("text", TensorProto.STRING, ["batch"]),
            helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", None, 4]),
        ],
        outputs=[
            helper.make_tensor_value_info("text_out", TensorProto.STRING, ["batch"]),
            helper.make_tensor_value_info("ids_out", TensorProto.INT64, ["batch", None, 4]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, tmp_path / "model.onnx")
    rt = load_runtime(_version(tmp_path, "onnxruntime", "model.onnx"), Threads(1, 1))
    meta = rt.metadata
    assert meta.inputs == (
        TensorSpec("text", "object", (-1,)),
        TensorSpec("ids", "int64", (-1, -1, 4)),
    )
    assert meta.outputs == (
        TensorSpec("text_out", "object", (-1,)),
        TensorSpec("ids_out", "int64", (-1, -1, 4)),
    )
    ids = np.arange(24, dtype=np.int64).reshape(2, 3, 4)
    out = rt.infer({"text": np.array(["ab", "cde"], dtype=object), "ids": ids})
    assert list(out["text_out"]) == ["ab", "cde"]
    np.testing.assert_array_equal(out["ids_out"], ids)
    rt.close()


def test_tensorflow_string_input_is_object(tmp_path: Path) -> None:
    # Through tf_backend, so TensorFlow is imported with the thread-pool environment set.
    from models.backends.tf_backend import tf

    @tf.function(input_signature=[{"text": tf.TensorSpec([None], tf.string, name="text")}])
    def serve(inputs: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        return {"length": tf.strings.length(inputs["text"])}

    module = tf.Module()
    tf.saved_model.save(
        module, str(tmp_path / "sm"), signatures={"serving_default": serve.get_concrete_function()}
    )
    rt = load_runtime(_version(tmp_path, "tensorflow", "sm"), Threads(1, 1))
    assert rt.metadata.inputs == (TensorSpec("text", "object", (-1,)),)
    assert rt.metadata.outputs == (TensorSpec("length", "int32", (-1,)),)
    out = rt.infer({"text": np.array([b"ab", b"cde", b""], dtype=object)})
    np.testing.assert_array_equal(out["length"], [2, 3, 0])
    rt.close()
