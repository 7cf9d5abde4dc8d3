"""A small helper to build ONNX graphs node by node with readable, unique tensor names."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class GraphBuilder:
    """Accumulates nodes and initializers; every node is named after its (single) output."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []

    def const(self, name: str, value: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(value, name))
        return name

    def tensor(self, proto: TensorProto) -> str:
        """An initializer built elsewhere (e.g. packed INT4 data)."""
        self.initializers.append(proto)
        return proto.name

    def node(
        self, op: str, inputs: list[str], output: str, *, domain: str = "", **attrs: Any
    ) -> str:
        self.nodes.append(
            helper.make_node(op, inputs, [output], name=output, domain=domain or None, **attrs)
        )
        return output
