"""Write a ``ModelSpec`` with its weights as an ONNX model, built node by node with onnx.helper.

A layer's parameters may also be quantized (``models.zoo_checkpoint.QuantParams``): each such
layer then runs the way its serving plan says (``models.serving_plan``): a packed kernel
(``com.microsoft.MatMulNBits``, convolutions as im2col feeding it) or codes dequantized in the
graph for a ``Conv``/``Gemm`` (``models.quant_onnx``), so ONNX Runtime serves a checkpoint's
codes directly; a layer dequantized at load comes in as float parameters.

Inputs keep the model-boundary layout (NHWC images) so that the ONNX and TensorFlow versions of a
model take identical tensors; the graph transposes to NCHW for ONNX's Conv/MaxPool, keeps NHWC
for the im2col convolutions and transposes back to NHWC before flattening (only where the layout
changes), so the Dense weights mean the same in both exports. The output is a
deterministic function of (spec, weights): the same inputs always give the same bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from models import quant_onnx
from models.onnx_graph import GraphBuilder
from models.serving_plan import Way
from models.zoo import (
    Conv2D,
    Dense,
    Flatten,
    Layer,
    MaxPool2D,
    ModelSpec,
    Params,
    layer_shapes,
    same_pads,
)
from models.zoo import input_shape as spec_input_shape
from models.zoo_checkpoint import LayerParams, QuantParams

OPSET = 17
# IR 8 is the version that introduced opset 17; pinning it keeps the files loadable by older
# ONNX Runtime releases than the one that happens to build them.
IR_VERSION = 8
BATCH_DIM = "batch"


def build_onnx(
    spec: ModelSpec,
    weights: Sequence[LayerParams],
    *,
    accuracy_level: int = quant_onnx.DEFAULT_ACCURACY_LEVEL,
    ways: Mapping[int, Way] | None = None,
) -> onnx.ModelProto:
    """The model as an in-memory ONNX proto (checked). ``accuracy_level`` is MatMulNBits's, for
    quantized layers (4: int8 activations; 0: fp32). ``ways``: how each quantized layer runs
    (layer index -> ``models.serving_plan.Way``; see ``quant_onnx.default_way`` for a layer it
    leaves out); a ``load`` layer's parameters must already be float (``plan_zoo.with_ways``)."""
    b = _LayerWriter(GraphBuilder(), accuracy_level, dict(ways or {}))
    if len(spec.inputs) == 1:
        x = spec.inputs[0].name
    else:
        x = b.g.node("Concat", [i.name for i in spec.inputs], "concat", axis=-1)
    shape = spec_input_shape(spec)
    last = len(spec.layers) - 1
    for i, (layer, p, out_shape) in enumerate(
        zip(spec.layers, weights, layer_shapes(spec), strict=True)
    ):
        # The last layer writes the graph output directly unless a softmax follows it.
        out = spec.output if i == last and not spec.softmax else f"l{i}"
        x = b.layer(_Step(i, out, shape, out_shape), layer, x, p)
        shape = out_shape
    if spec.softmax:
        x = b.g.node("Softmax", [x], spec.output, axis=-1)
    return _model(spec, weights, b.g)


@dataclass(frozen=True, slots=True)
class _Step:
    """Where a layer stands: its index, its output's name, its input and output shapes."""

    i: int
    out: str
    shape: tuple[int, ...]
    out_shape: tuple[int, ...]


@dataclass(slots=True)
class _LayerWriter:
    """Writes the layers' nodes in turn, tracking the layout of the current feature map."""

    g: GraphBuilder
    accuracy_level: int
    ways: dict[int, Way]
    layout: str = "nhwc"  # of the current tensor when it is a feature map

    def way(self, i: int, layer: Layer, p: LayerParams) -> Way | None:
        """How layer ``i`` runs when its kernel is quantized (None when it is not)."""
        if not isinstance(p, QuantParams):
            return None
        return self.ways.get(i) or quant_onnx.default_way(layer, p.kernel.data)

    def layer(self, step: _Step, layer: Layer, x: str, p: LayerParams) -> str:
        i, out = step.i, step.out
        match layer:
            case Dense():
                way = self.way(i, layer, p)
                return _dense(self.g, i, x, p, out, layer.activation, self.accuracy_level, way)
            case Conv2D():
                return self.conv(step, layer, x, p)
            case MaxPool2D(pool=pool):
                x = self.to_layout(i, x, "nchw")
                return self.g.node(
                    "MaxPool", [x], out, kernel_shape=[pool, pool], strides=[layer.step] * 2
                )
            case Flatten():
                x = self.to_layout(i, x, "nhwc")
                return self.g.node("Flatten", [x], out, axis=1)
        raise ValueError(f"layer {i}: {layer!r} cannot be exported")

    def to_layout(self, i: int, x: str, wanted: str) -> str:
        x = _to_layout(self.g, i, x, self.layout, wanted)
        self.layout = wanted
        return x

    def conv(self, step: _Step, layer: Conv2D, x: str, p: LayerParams) -> str:
        i, k, s = step.i, layer.kernel, layer.stride
        pads = (0, 0, 0, 0)
        if layer.padding == "same":
            top, bottom = same_pads(step.shape[0], k, s)
            left, right = same_pads(step.shape[1], k, s)
            pads = (top, left, bottom, right)
        if isinstance(p, QuantParams) and self.way(i, layer, p) == "packed":
            x = self.to_layout(i, x, "nhwc")
            return self.conv_as_matmul(step, layer, x, p, pads)
        x = self.to_layout(i, x, "nchw")
        w = _conv_kernel(self.g, i, p)
        b = self.g.const(f"l{i}_bias", _bias(p))
        return _activated(
            self.g,
            "Conv",
            [x, w, b],
            step.out,
            layer.activation,
            kernel_shape=[k, k],
            strides=[s, s],
            pads=list(pads),
        )

    def conv_as_matmul(
        self, step: _Step, layer: Conv2D, x: str, p: QuantParams, pads: tuple[int, int, int, int]
    ) -> str:
        """im2col on NHWC and MatMulNBits over the codes."""
        out = step.out
        pre = out if layer.activation == "linear" else f"{out}_pre"
        x = quant_onnx.conv_matmul_nbits(
            self.g,
            f"l{step.i}",
            x,
            p.kernel.data,
            p.bias,
            kernel=(layer.kernel, layer.kernel),
            stride=layer.stride,
            pads=pads,
            out_hw=(step.out_shape[0], step.out_shape[1]),
            out=pre,
            accuracy_level=self.accuracy_level,
        )
        if layer.activation != "linear":
            x = self.g.node("Relu", [x], out)
        return x


def _model(spec: ModelSpec, weights: Sequence[LayerParams], g: GraphBuilder) -> onnx.ModelProto:
    """The graph's nodes and initializers as a checked model, with the opsets they need."""
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
    quantized = any(isinstance(p, QuantParams) for p in weights)
    opsets = [helper.make_opsetid("", quant_onnx.QUANT_OPSET if quantized else OPSET)]
    if any(n.domain == quant_onnx.MS_DOMAIN for n in g.nodes):
        opsets.append(helper.make_opsetid(quant_onnx.MS_DOMAIN, 1))
    model = helper.make_model(
        graph,
        opset_imports=opsets,
        producer_name="iotgw.models.zoo",
        ir_version=quant_onnx.QUANT_IR_VERSION if quantized else IR_VERSION,
        doc_string=spec.description,
    )
    onnx.checker.check_model(model, full_check=True)
    return model


def layer_model(
    layer: Layer,
    p: LayerParams,
    shapes: tuple[tuple[int, ...], tuple[int, ...]],
    way: Way,
    accuracy_level: int,
) -> onnx.ModelProto:
    """One layer alone on any batch size, its quantized kernel run ``way`` (``p`` already float for
    ``load``): what the serving plan times. ``shapes`` are its input and output shapes in the
    model (NHWC). The input comes in the layout that way reads (NCHW for a ``Conv``, NHWC for
    im2col), so no layout change is charged to either."""
    in_shape, out_shape = shapes
    conv = isinstance(layer, Conv2D)
    layout = "nchw" if conv and way != "packed" else "nhwc"
    b = _LayerWriter(GraphBuilder(), accuracy_level, {0: way}, layout)
    b.layer(_Step(0, "y", in_shape, out_shape), layer, "x", p)
    shape = [in_shape[2], in_shape[0], in_shape[1]] if layout == "nchw" and conv else in_shape
    graph = helper.make_graph(
        b.g.nodes,
        "layer",
        inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, [BATCH_DIM, *shape])],
        outputs=[helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=b.g.initializers,
    )
    opsets = [helper.make_opsetid("", quant_onnx.QUANT_OPSET)]
    opsets.append(helper.make_opsetid(quant_onnx.MS_DOMAIN, 1))
    return helper.make_model(graph, opset_imports=opsets, ir_version=quant_onnx.QUANT_IR_VERSION)


def _to_layout(g: GraphBuilder, i: int, x: str, layout: str, wanted: str) -> str:
    if layout == wanted:
        return x
    perm = [0, 3, 1, 2] if wanted == "nchw" else [0, 2, 3, 1]
    return g.node("Transpose", [x], f"l{i}_{wanted}", perm=perm)


def _bias(p: LayerParams) -> np.ndarray:
    if p is None:
        raise ValueError("a Dense or Conv2D layer needs parameters")
    return p.bias


def _dense(
    g: GraphBuilder,
    i: int,
    x: str,
    p: LayerParams,
    out: str,
    activation: str,
    accuracy_level: int,
    way: Way | None,
) -> str:
    if isinstance(p, Params):
        w = g.const(f"l{i}_kernel", p.kernel)
        b = g.const(f"l{i}_bias", p.bias)
        return _activated(g, "Gemm", [x, w, b], out, activation)
    if p is None:
        raise ValueError(f"layer {i}: a Dense layer needs parameters")
    data = p.kernel.data  # [out, in], blocks along in
    pre = out if activation == "linear" else f"{out}_pre"
    if way == "packed":
        y = quant_onnx.matmul_nbits(g, f"l{i}", x, data, p.bias, pre, accuracy_level)
    else:
        w = quant_onnx.dequantized(g, f"l{i}", data)  # [out, in]
        b = g.const(f"l{i}_bias", p.bias)
        y = g.node("Gemm", [x, w, b], pre, transB=1)
    return y if activation == "linear" else g.node("Relu", [y], out)


def _conv_kernel(g: GraphBuilder, i: int, p: LayerParams) -> str:
    """The OIHW kernel: a constant, or dequantized from codes on every run."""
    if isinstance(p, Params):
        return g.const(f"l{i}_kernel", np.ascontiguousarray(p.kernel.transpose(3, 2, 0, 1)))
    if p is None:
        raise ValueError(f"layer {i}: a Conv2D layer needs parameters")
    flat = quant_onnx.dequantized(g, f"l{i}", p.kernel.data)  # [O, I*kh*kw]
    shape = g.const(f"l{i}_kernel_shape", np.array(p.kernel.shape, np.int64))
    return g.node("Reshape", [flat, shape], f"l{i}_kernel")


def _activated(
    g: GraphBuilder, op: str, inputs: list[str], out: str, activation: str, **attrs: Any
) -> str:
    if activation == "linear":
        return g.node(op, inputs, out, **attrs)
    pre = g.node(op, inputs, f"{out}_pre", **attrs)
    return g.node("Relu", [pre], out)


def export_onnx(spec: ModelSpec, weights: Sequence[LayerParams], path: Path) -> Path:
    """Write the model to ``path`` (parent folders must exist) and return it."""
    path.write_bytes(build_onnx(spec, weights).SerializeToString())
    return path
