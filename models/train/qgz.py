"""qgZ: int4 gradient averaging through the two-hop scheme, with optional error feedback.

Per step each simulated worker holds its own gradient. For every kernel (in the checkpoint's
output-major layout, as PyTorch holds it), ZeRO++'s ``all_to_all_quant_reduce`` does:

1. each worker quantizes its gradient to int4 (``models.quant``'s absmax rule: fp16 input,
   fp32 scales) and sends it to the other workers of its node (all-to-all inside the node);
2. inside each node the int4 gradients are dequantized and averaged, and the node's average is
   quantized to int4 again (the second quantization);
3. those are exchanged across nodes (all-to-all between the workers of equal local rank),
   dequantized and averaged over the nodes.

The result is ``mean_n deq(q(mean_{w in n} deq(q(g_w))))``. Each hop really moves only a slice
of the tensor, but with groups that never straddle two slices the slicing does not change a
single value, so the simulation quantizes whole tensors.

Grouping, as DeepSpeed's ``all_to_all_quant_reduce`` chooses it: the flattened tensor is cut
into ``max(shape[0], shape[1], world_size)`` contiguous groups of equal size (shape of the
output-major tensor: ``[out, in]`` or ``[O, I, kh, kw]``); when the world size does not divide
the element count, ``max(shape[0], shape[1])`` groups, which always does. Both hops use the same
groups. 1-D tensors (biases) are averaged in float32, as DeepSpeed falls back to a plain
reduce-scatter for them.

Error feedback (``error_feedback=True``; DeepSpeed's LoCo is a refinement of it): each worker
adds the quantization error it made last step to its gradient before quantizing, and each node
does the same with the error of its second quantization, so no part of a gradient is lost for
good, only delayed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from models.quant import quantize_flat_groups

QGZ_BITS = 4


def qgz_group_count(shape: Sequence[int], world_size: int) -> int:
    """Groups of a tensor of (output-major) ``shape``: max(shape[0], shape[1], world size),
    falling back to max(shape[0], shape[1]) when that does not divide the element count."""
    if len(shape) < 2:
        raise ValueError(f"qgZ quantizes tensors of two or more dims, got shape {tuple(shape)}")
    numel = int(np.prod(shape))
    groups = max(shape[0], shape[1], world_size)
    return groups if numel % groups == 0 else max(shape[0], shape[1])


def quantize_dequantize(tensors: np.ndarray, groups: int) -> np.ndarray:
    """``deq(q(t))`` at int4 of every tensor ``t`` of the stack ``tensors`` (first axis), each
    in ``groups`` contiguous groups of the flattened tensor. The groups never straddle two
    tensors, so one call over the whole stack gives the same values as one call per tensor."""
    data = quantize_flat_groups(tensors, QGZ_BITS, groups * tensors.shape[0])
    return data.dequantize().reshape(tensors.shape)


class TwoHopAverager:
    """Averages the workers' gradients of one tensor through qgZ's two hops.

    ``nodes`` x ``per_node`` workers; worker ``w`` sits on node ``w // per_node``. With error
    feedback the object keeps the residuals (per worker and per node) between steps.
    """

    def __init__(
        self, shape: Sequence[int], nodes: int, per_node: int, error_feedback: bool = False
    ) -> None:
        self.shape = tuple(int(d) for d in shape)
        self.nodes = nodes
        self.per_node = per_node
        self.groups = qgz_group_count(self.shape, nodes * per_node)
        self.error_feedback = error_feedback
        self.worker_residual = np.zeros((nodes * per_node, *self.shape), np.float32)
        self.node_residual = np.zeros((nodes, *self.shape), np.float32)

    def average(self, grads: np.ndarray) -> np.ndarray:
        """``grads``: ``[world, *shape]`` float32, one row per worker. Returns the average."""
        world = self.nodes * self.per_node
        if grads.shape != (world, *self.shape):
            raise ValueError(f"expected gradients of shape {(world, *self.shape)}, {grads.shape}")
        sent = grads.astype(np.float32)
        if self.error_feedback:
            sent = sent + self.worker_residual
        first = quantize_dequantize(sent, self.groups)
        if self.error_feedback:
            self.worker_residual = sent - first
        node_means = first.reshape(self.nodes, self.per_node, *self.shape).mean(axis=1)
        node_means = node_means.astype(np.float32)
        if self.error_feedback:
            node_means = node_means + self.node_residual
        second = quantize_dequantize(node_means, self.groups)
        if self.error_feedback:
            self.node_residual = node_means - second
        return second.mean(axis=0).astype(np.float32)
