"""Bytes moved per training step by ZeRO-3 (fp16) and by ZeRO++ (qwZ + hpZ + qgZ).

Counted from the model's real tensors, for ``W = nodes * per_node`` ranks, as the bytes every
rank receives, summed over ranks, split into what stays inside a node and what crosses between
nodes (the slow links ZeRO++ is about). Each tensor is partitioned evenly over the ranks it is
gathered from or reduced to.

- all-gather of ``S`` bytes over all ``W`` ranks: a rank receives the ``W - 1`` shards it lacks,
  ``L - 1`` of them from its own node (``L = per_node``): ``(L-1) S`` intra, ``(W-L) S`` inter.
- reduce-scatter of ``S`` bytes: symmetric to the all-gather, the same counts.
- ZeRO-3 per step: forward all-gather, backward all-gather and gradient reduce-scatter, all fp16.
- ZeRO++: forward all-gather of qwZ codes + fp32 scales (float tensors in fp16); backward
  all-gather from hpZ's secondary copy inside each node only, fp16: ``N (L-1) S`` intra,
  nothing inter (``N`` nodes; each rank receives the ``(L-1)/L`` of the tensor it lacks);
  gradients through qgZ's two hops, int4 codes + fp32 scales ``Q``: the intra-node
  all-to-all moves ``N (L-1) Q``, the inter-node one ``(N-1) Q`` (each rank holds ``1/L``
  of its node's sum and sends ``(N-1)/N`` of it); 1-D tensors fall back to an fp16 reduce-scatter.

DeepSpeed keeps parameters under 1e5 elements replicated (never gathered); a model this small
would then move nothing, so this accounting treats every tensor as partitioned.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from models.quant import packed_size
from models.train.qgz import QGZ_BITS, qgz_group_count

FP16_BYTES = 2
SCALE_BYTES = 4  # fp32 scales


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """A parameter as the collectives see it: output-major shape, and whether qwZ quantizes it
    (a kernel) or it stays float (a bias)."""

    name: str
    shape: tuple[int, ...]
    quantized: bool

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True, slots=True)
class Layout:
    nodes: int
    per_node: int

    @property
    def world(self) -> int:
        return self.nodes * self.per_node


@dataclass(frozen=True, slots=True)
class Collective:
    """One collective of one step, all its tensors together: bytes received, summed over
    ranks, inside nodes and across nodes."""

    name: str
    intra_bytes: int
    inter_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.intra_bytes + self.inter_bytes


@dataclass(frozen=True, slots=True)
class StepTraffic:
    scheme: str
    collectives: tuple[Collective, ...]

    @property
    def intra_bytes(self) -> int:
        return sum(c.intra_bytes for c in self.collectives)

    @property
    def inter_bytes(self) -> int:
        return sum(c.inter_bytes for c in self.collectives)

    @property
    def total_bytes(self) -> int:
        return self.intra_bytes + self.inter_bytes


def fp16_bytes(tensor: TensorInfo) -> int:
    return FP16_BYTES * tensor.numel


def qwz_bytes(tensor: TensorInfo, bits: int, block_size: int) -> int:
    """Packed codes and fp32 scales of a kernel quantized in blocks along its input dim."""
    rows = tensor.shape[0]
    cols = tensor.numel // rows
    return packed_size(tensor.numel, bits) + SCALE_BYTES * rows * math.ceil(cols / block_size)


def qgz_bytes(tensor: TensorInfo, world: int) -> int:
    """int4 codes and fp32 scales of a gradient in qgZ's groups."""
    return packed_size(tensor.numel, QGZ_BITS) + SCALE_BYTES * qgz_group_count(tensor.shape, world)


def _all_gather(name: str, size: int, layout: Layout) -> Collective:
    return Collective(name, (layout.per_node - 1) * size, (layout.world - layout.per_node) * size)


def zero3_traffic(tensors: Sequence[TensorInfo], layout: Layout) -> StepTraffic:
    size = sum(fp16_bytes(t) for t in tensors)
    return StepTraffic(
        "ZeRO-3 (fp16)",
        (
            _all_gather("forward all-gather (fp16)", size, layout),
            _all_gather("backward all-gather (fp16)", size, layout),
            _all_gather("gradient reduce-scatter (fp16)", size, layout),
        ),
    )


def zeropp_traffic(
    tensors: Sequence[TensorInfo], layout: Layout, bits: int, block_size: int
) -> StepTraffic:
    gathered = sum(
        qwz_bytes(t, bits, block_size) if t.quantized else fp16_bytes(t) for t in tensors
    )
    fp16_all = sum(fp16_bytes(t) for t in tensors)
    q_grads = sum(qgz_bytes(t, layout.world) for t in tensors if t.quantized)
    float_grads = sum(fp16_bytes(t) for t in tensors if not t.quantized)
    reduce_floats = _all_gather("bias reduce-scatter (fp16)", float_grads, layout)
    return StepTraffic(
        f"ZeRO++ (qwZ int{bits} + hpZ + qgZ int4)",
        (
            _all_gather(f"forward all-gather (qwZ int{bits})", gathered, layout),
            Collective(
                "backward all-gather (hpZ, inside the node, fp16)",
                layout.nodes * (layout.per_node - 1) * fp16_all,
                0,
            ),
            Collective(
                "gradient all-to-all inside nodes (qgZ int4)",
                layout.nodes * (layout.per_node - 1) * q_grads,
                0,
            ),
            Collective(
                "gradient all-to-all across nodes (qgZ int4)", 0, (layout.nodes - 1) * q_grads
            ),
            reduce_floats,
        ),
    )
