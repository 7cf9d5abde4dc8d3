"""Write a ``ModelSpec`` with its weights as an ONNX model, built node by node with onnx.helper.

Inputs keep the model-boundary layout (NHWC images) so that the ONNX and TensorFlow versions of a
model take identical tensors; the graph transposes to NCHW for ONNX's Conv/MaxPool and back to
NHWC before flattening, so the Dense weights mean the same in both exports. The output is a
deterministic function of (spec, weights): the same inputs always give the same bytes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from models.zoo import (
    Conv2D,
    Dense,
    Flatten,
    MaxPool2D,
    ModelSpec,
    Weights,
    layer_shapes,
    same_pads,
)
from models.zoo import input_shape as spec_input_shape

OPSET = 17
# IR 8 is the version that introduced opset 17; pinning it keeps the files loadable by older
# ONNX Runtime releases than the one that happens to build them.
IR_VERSION = 8
BATCH_DIM = "batch"


class _Graph:
    """Accumulates nodes and initializers with unique, readable tensor names."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []

    def const(self, name: str, value: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(value, name))
        return name

    def node(self, op: str, inputs: list[str], output: str, **attrs: object) -> str:
        self.nodes.append(helper.make_node(op, inputs, [output], name=output, **attrs))
        return output


def build_onnx(spec: ModelSpec, weights: Weights) -> onnx.ModelProto:
    """The model as an in-memory ONNX proto (checked)."""
    g = _Graph()
    if len(spec.inputs) == 1:
        x = spec.inputs[0].name
    else:
        x = g.node("Concat", [i.name for i in spec.inputs], "concat", axis=-1)
    nchw = False  # layout of the current tensor when it is a feature map
    shape = spec_input_shape(spec)
    last = len(spec.layers) - 1
    for i, (layer, p, out_shape) in enumerate(
        zip(spec.layers, weights, layer_shapes(spec), strict=True)
    ):
        # The last layer writes the graph output directly unless a softmax follows it.
        out = spec.output if i == last and not spec.softmax else f"l{i}"
        if isinstance(layer, Conv2D | MaxPool2D) and not nchw:
            x = g.node("Transpose", [x], f"l{i}_nchw", perm=[0, 3, 1, 2])
            nchw = True
        match layer:
            case Dense():
                assert p is not None
                w = g.const(f"l{i}_kernel", p.kernel)
                b = g.const(f"l{i}_bias", p.bias)
                x = _activated(g, "Gemm", [x, w, b], out, layer.activation)
            case Conv2D(kernel=k, stride=s, padding=padding):
                assert p is not None
                pads = [0, 0, 0, 0]
                if padding == "same":
                    top, bottom = same_pads(shape[0], k, s)
                    left, right = same_pads(shape[1], k, s)
                    pads = [top, left, bottom, right]
                w = g.const(f"l{i}_kernel", np.ascontiguousarray(p.kernel.transpose(3, 2, 0, 1)))
                b = g.const(f"l{i}_bias", p.bias)
                x = _activated(
                    g,
                    "Conv",
                    [x, w, b],
                    out,
                    layer.activation,
                    kernel_shape=[k, k],
                    strides=[s, s],
                    pads=pads,
                )
            case MaxPool2D(pool=pool):
                x = g.node("MaxPool", [x], out, kernel_shape=[pool, pool], strides=[layer.step] * 2)
            case Flatten():
                if nchw:
                    x = g.node("Transpose", [x], f"l{i}_nhwc", perm=[0, 2, 3, 1])
                    nchw = False
                x = g.node("Flatten", [x], out, axis=1)
        shape = out_shape
    if spec.softmax:
        x = g.node("Softmax", [x], spec.output, axis=-1)

    graph = helper.make_graph(
        g.nodes,
        spec.name,
        inputs=[
            helper.make_tensor_value_info(i.name, TensorProto.FLOAT, [BATCH_DIM, *i.shape])
            for i in spec.inputs
        ],
        outputs=[
            helper.make_tensor_value_info(
                spec.output, TensorProto.FLOAT, [BATCH_DIM, *spec.output_shape]
            )
        ],
        initializer=g.initializers,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="iotgw.models.zoo",
        ir_version=IR_VERSION,
        doc_string=spec.description,
    )
    onnx.checker.check_model(model, full_check=True)
    return model


def _activated(
    g: _Graph, op: str, inputs: list[str], out: str, activation: str, **attrs: object
) -> str:
    if activation == "linear":
        return g.node(op, inputs, out, **attrs)
    pre = g.node(op, inputs, f"{out}_pre", **attrs)
    return g.node("Relu", [pre], out)


def export_onnx(spec: ModelSpec, weights: Weights, path: Path) -> Path:
    """Write the model to ``path`` (parent folders must exist) and return it."""
    path.write_bytes(build_onnx(spec, weights).SerializeToString())
    return path
