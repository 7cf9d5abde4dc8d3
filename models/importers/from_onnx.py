"""Import an fp32 ONNX model: quantize its MatMul/Gemm and Conv weights, rewrite the graph.

The checkpoint's architecture is ``{"kind": "onnx", "graph": GRAPH_TENSOR, "rewrites": {...}}``:
the float graph, without the initializers that became checkpoint tensors, serialized into the
``bytes`` tensor ``GRAPH_TENSOR`` (so the checksum covers it), and for each quantized weight the
node that consumes it. Float initializers (biases, norms, weights kept in float) are ordinary
float checkpoint tensors; non-float ones (shapes, indices) stay inside the graph.

``rebuild_onnx`` turns that back into a runnable graph (ONNX Runtime only): a quantized weight
of a MatMul or Gemm becomes ``MatMulNBits`` (2, 4, 8 bits; the Gemm's bias goes into it) or, at
3 and 6 bits, a blocked ``DequantizeLinear`` feeding the original node; a Conv weight is
dequantized and reshaped in the graph. Quantized weights are stored output-major like every
checkpoint weight: a MatMul's ``B [K, N]`` as its transpose ``[N, K]``, a Conv's ``[O, I, k...]``
flattened to ``[O, I*k...]``, blocks always along the input dimension.

A weight is quantized only when it is a float32 initializer used by exactly one node, as a
MatMul's 2-D ``B``, a Gemm's ``B`` (``alpha = 1``, ``transA = 0``, ``beta = 1`` when there is a
``C``) or a Conv's ``W``; everything else stays as it was, and the report says why. Blocked
``DequantizeLinear`` needs opset 21, so a model with a lower opset that needs it is converted
with ``onnx.version_converter`` at import (and the report says so).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from models import quant_onnx
from models.checkpoint import ONNX_KIND, Checkpoint, CheckpointError, QuantizedTensor, Tensor
from models.importers.report import (
    ImportFailed,
    ImportReport,
    QuantOptions,
    TensorDecision,
    quantized_detail,
)
from models.onnx_graph import GraphBuilder
from models.quant import BlockQuantized, quantize_blocks

GRAPH_TENSOR = "__onnx_graph__"
_OPS = ("MatMul", "Gemm", "Conv")


@dataclass(frozen=True, slots=True)
class _Candidate:
    node: onnx.NodeProto
    weight: np.ndarray  # output-major [N, K...]


def import_onnx(source: Path, options: QuantOptions) -> tuple[Checkpoint, ImportReport]:
    model = _load(source)
    notes: list[str] = []
    _name_nodes(model.graph)
    decisions: list[TensorDecision] = []
    candidates = _candidates(model.graph, decisions)
    chosen = _choose(candidates, options, decisions)
    if (
        chosen
        and _needs_dequantize_linear(chosen, options)
        and _opset(model) < quant_onnx.QUANT_OPSET
    ):
        model = _convert_for_dequantize_linear(model, source, notes)
    tensors, rewrites = _quantize(chosen, options, decisions)
    graph = model.graph
    kept = _take_float_initializers(graph, tensors, candidates, decisions)
    if GRAPH_TENSOR in tensors:
        raise ImportFailed(f"{source}: an initializer is named {GRAPH_TENSOR!r}, reserved here")
    del graph.initializer[:]
    graph.initializer.extend(kept)
    tensors[GRAPH_TENSOR] = np.frombuffer(model.SerializeToString(), np.uint8)
    architecture = {"kind": ONNX_KIND, "graph": GRAPH_TENSOR, "rewrites": rewrites}
    checkpoint = Checkpoint(architecture, tensors, frozenset({GRAPH_TENSOR}))
    return checkpoint, ImportReport(str(source), tuple(decisions), tuple(notes))


def _load(source: Path) -> onnx.ModelProto:
    try:
        model = onnx.load(str(source))
        onnx.checker.check_model(model)
    except Exception as exc:  # onnx raises DecodeError, ValidationError, OSError...
        raise ImportFailed(f"{source}: not a valid ONNX model: {exc}") from exc
    return model


def _choose(
    candidates: dict[str, _Candidate], options: QuantOptions, decisions: list[TensorDecision]
) -> dict[str, _Candidate]:
    """The candidates the options let be quantized; the others are recorded as kept in float."""
    chosen: dict[str, _Candidate] = {}
    for name, candidate in candidates.items():
        shape = tuple(candidate.weight.shape)
        reason = options.float_reason(name, shape)
        if reason is not None:
            decisions.append(TensorDecision(name, shape, False, reason))
            continue
        chosen[name] = candidate
    return chosen


def _convert_for_dequantize_linear(
    model: onnx.ModelProto, source: Path, notes: list[str]
) -> onnx.ModelProto:
    before = _opset(model)
    try:
        model = onnx.version_converter.convert_version(model, quant_onnx.QUANT_OPSET)
    except Exception as exc:
        raise ImportFailed(
            f"{source}: blocked DequantizeLinear needs opset {quant_onnx.QUANT_OPSET} and "
            f"converting from opset {before} failed ({exc}); try --bits 2, 4 or 8 with "
            f"--keep-float for the convolutions"
        ) from exc
    notes.append(
        f"converted from opset {before} to {quant_onnx.QUANT_OPSET} (blocked DequantizeLinear)"
    )
    return model


def _quantize(
    chosen: dict[str, _Candidate], options: QuantOptions, decisions: list[TensorDecision]
) -> tuple[dict[str, Tensor], dict[str, dict[str, str]]]:
    """The chosen weights as quantized tensors, and the node that consumes each."""
    tensors: dict[str, Tensor] = {}
    rewrites: dict[str, dict[str, str]] = {}
    for name, candidate in chosen.items():
        rows = candidate.weight.reshape(candidate.weight.shape[0], -1)
        data = quantize_blocks(rows, options.bits, options.block_size)
        tensors[name] = QuantizedTensor(tuple(candidate.weight.shape), "float32", data)
        rewrites[name] = {"node": candidate.node.name, "op": candidate.node.op_type}
        decisions.append(
            TensorDecision(
                name,
                tuple(candidate.weight.shape),
                True,
                f"{candidate.node.op_type} {candidate.node.name!r}: "
                + quantized_detail(options.bits, options.block_size, candidate.weight.shape),
            )
        )
    return tensors, rewrites


def _take_float_initializers(
    graph: onnx.GraphProto,
    tensors: dict[str, Tensor],
    candidates: dict[str, _Candidate],
    decisions: list[TensorDecision],
) -> list[onnx.TensorProto]:
    """Float initializers not quantized become float checkpoint tensors; returns the others
    (shapes, indices, external data), which stay inside the graph."""
    kept = []
    for init in graph.initializer:
        if init.name in tensors:
            continue
        if (
            init.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE)
            and not init.external_data
        ):
            tensors[init.name] = numpy_helper.to_array(init)
            if init.name not in candidates and not any(d.name == init.name for d in decisions):
                decisions.append(
                    TensorDecision(
                        init.name,
                        tuple(init.dims),
                        False,
                        "kept in float: not a MatMul/Gemm/Conv weight (bias, norm, ...)",
                    )
                )
        else:
            kept.append(init)
    return kept


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)


def _name_nodes(graph: onnx.GraphProto) -> None:
    """Give every node a unique name: the checkpoint finds a weight's consumer by it."""
    seen: set[str] = set()
    for index, node in enumerate(graph.node):
        if not node.name or node.name in seen:
            node.name = f"{node.op_type}_{index}"
            while node.name in seen:
                node.name += "_"
        seen.add(node.name)


def _needs_dequantize_linear(chosen: dict[str, _Candidate], options: QuantOptions) -> bool:
    if options.bits not in quant_onnx.MATMUL_NBITS:
        return True
    return any(c.node.op_type == "Conv" for c in chosen.values())


def _candidates(graph: onnx.GraphProto, decisions: list[TensorDecision]) -> dict[str, _Candidate]:
    """Initializers that are the weight of a MatMul, Gemm or Conv and can be quantized; the
    others among those weights are reported as kept in float, with the reason."""
    inits = {i.name: i for i in graph.initializer}
    uses = Counter(name for node in graph.node for name in node.input)
    graph_inputs = {i.name for i in graph.input}
    found: dict[str, _Candidate] = {}
    for node in graph.node:
        if node.op_type not in _OPS or len(node.input) < 2 or node.input[1] not in inits:
            continue
        name = node.input[1]
        init = inits[name]
        shape = tuple(init.dims)

        def keep(reason: str, name: str = name, shape: tuple[int, ...] = shape) -> None:
            decisions.append(TensorDecision(name, shape, False, f"kept in float: {reason}"))

        if init.data_type != TensorProto.FLOAT:
            keep(f"{TensorProto.DataType.Name(init.data_type)} weight (only float32 is quantized)")
            continue
        if uses[name] != 1 or name in graph_inputs:
            keep("used by several nodes or overridable as a graph input")
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        weight = numpy_helper.to_array(init)
        if node.op_type == "MatMul":
            if weight.ndim != 2:
                keep(f"a {weight.ndim}-D MatMul operand")
                continue
            weight = weight.T  # B [K, N] -> [N, K]
        elif node.op_type == "Gemm":
            has_c = len(node.input) > 2 and node.input[2] != ""
            if attrs.get("alpha", 1.0) != 1.0 or attrs.get("transA", 0) != 0:
                keep("Gemm with alpha != 1 or transA")
                continue
            if has_c and attrs.get("beta", 1.0) != 1.0:
                keep("Gemm with beta != 1")
                continue
            if not attrs.get("transB", 0):
                weight = weight.T
        elif weight.ndim < 3 or attrs.get("group", 1) < 1:
            keep("not a convolution kernel")
            continue
        found[name] = _Candidate(node, np.ascontiguousarray(weight))
    return found


# -- load time ------------------------------------------------------------------------------


def rebuild_onnx(checkpoint: Checkpoint, path: Path, accuracy_level: int) -> onnx.ModelProto:
    """The runnable graph of an ``onnx`` checkpoint (``CheckpointError`` when it does not fit)."""
    arch = checkpoint.architecture
    if set(arch) != {"kind", "graph", "rewrites"} or not isinstance(arch["rewrites"], dict):
        raise CheckpointError(path, f"onnx architecture has keys {sorted(arch)}")
    graph_name = str(arch["graph"])
    blob = checkpoint.tensors.get(graph_name)
    if graph_name not in checkpoint.byte_tensors or not isinstance(blob, np.ndarray):
        raise CheckpointError(path, "missing: the ONNX graph bytes", graph_name)
    model = onnx.ModelProto()
    try:
        model.ParseFromString(blob.tobytes())
    except Exception as exc:  # protobuf's DecodeError
        raise CheckpointError(path, f"corrupt ONNX graph: {exc}", graph_name) from exc
    graph = model.graph
    nodes = {n.name: n for n in graph.node}
    initializers = GraphBuilder()
    prelude: list[onnx.NodeProto] = []  # dequantization: depends on initializers only
    replacements: dict[str, list[onnx.NodeProto]] = {}  # node name -> what takes its place
    for name, tensor in checkpoint.tensors.items():
        if name == graph_name:
            continue
        if not isinstance(tensor, QuantizedTensor):
            initializers.const(name, tensor)  # float initializers go back as they were
            continue
        rewrite = arch["rewrites"].get(name)
        if not isinstance(rewrite, dict) or rewrite.get("node") not in nodes:
            raise CheckpointError(path, "inconsistent: no graph node consumes it", name)
        node = nodes[rewrite["node"]]
        if node.op_type != rewrite.get("op") or len(node.input) < 2 or node.input[1] != name:
            raise CheckpointError(
                path,
                f"inconsistent: node {node.name!r} ({node.op_type}) does not take it as weight",
                name,
            )
        local = GraphBuilder()
        before, instead = _rewrite(local, node, tensor, checkpoint, accuracy_level)
        prelude += before
        replacements[node.name] = instead
        initializers.initializers += local.initializers
    ordered = prelude + [r for n in graph.node for r in replacements.get(n.name, [n])]
    del graph.node[:]
    graph.node.extend(ordered)
    # A Gemm bias fused into MatMulNBits is used no more: leave it out rather than have ONNX
    # Runtime warn about it on every load.
    used = {i for n in ordered for i in n.input} | {o.name for o in graph.output}
    graph.initializer.extend(t for t in initializers.initializers if t.name in used)
    uses_ms = any(n.domain == quant_onnx.MS_DOMAIN for n in ordered)
    if uses_ms and not any(o.domain == quant_onnx.MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(quant_onnx.MS_DOMAIN, 1))
    model.ir_version = max(model.ir_version, quant_onnx.QUANT_IR_VERSION)
    return model


def _rewrite(
    g: GraphBuilder,
    node: onnx.NodeProto,
    tensor: QuantizedTensor,
    checkpoint: Checkpoint,
    accuracy_level: int,
) -> tuple[list[onnx.NodeProto], list[onnx.NodeProto]]:
    """Nodes to run first (dequantization) and the nodes that replace ``node``."""
    data: BlockQuantized = tensor.data
    prefix = f"{node.name}_q"
    if node.op_type == "Conv":
        # Dequantized for the original node, never im2col + MatMulNBits: these graphs are NCHW
        # (patches would need a transpose per layer on top of the zoo's NHWC im2col), and
        # even the zoo's im2col loses to dequantizing beyond batch 1 and holds more memory
        # (quant_onnx.default_way).
        flat = quant_onnx.dequantized(g, prefix, data)  # [O, I*k...]
        shape = g.const(f"{prefix}_shape", np.array(tensor.shape, np.int64))
        kernel = g.node("Reshape", [flat, shape], f"{prefix}_kernel")
        return list(g.nodes), [_with_input(node, 1, kernel)]
    if not quant_onnx.matmul_nbits_fits(data):  # 3 or 6 bits: dequantize, keep the node
        weight = quant_onnx.dequantized(g, prefix, data)  # [N, K]
        if node.op_type == "MatMul":
            weight = g.node("Transpose", [weight], f"{prefix}_kn", perm=[1, 0])
            return list(g.nodes), [_with_input(node, 1, weight)]
        replacement = _with_input(node, 1, weight)
        del replacement.attribute[:]
        for attr in node.attribute:
            if attr.name != "transB":
                replacement.attribute.append(attr)
        replacement.attribute.append(helper.make_attribute("transB", 1))
        return list(g.nodes), [replacement]
    c = node.input[2] if node.op_type == "Gemm" and len(node.input) > 2 else ""
    bias = _vector(checkpoint.tensors.get(c), tensor.shape[0]) if c else None
    if c and bias is None:  # a C that is not a plain bias vector: add it after the product
        product = quant_onnx.matmul_nbits(
            g, prefix, node.input[0], data, None, f"{prefix}_mm", accuracy_level
        )
        g.node("Add", [product, c], node.output[0])
    else:
        quant_onnx.matmul_nbits(
            g, prefix, node.input[0], data, bias, node.output[0], accuracy_level
        )
    return [], list(g.nodes)


def _vector(value: object, size: int) -> np.ndarray | None:
    """``value`` as a float32 bias of ``size`` elements, if it is one."""
    if not isinstance(value, np.ndarray) or value.dtype != np.float32 or value.size != size:
        return None
    return value.reshape(-1) if value.ndim == 1 or value.shape == (1, size) else None


def _with_input(node: onnx.NodeProto, index: int, name: str) -> onnx.NodeProto:
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    copy.input[index] = name
    return copy
