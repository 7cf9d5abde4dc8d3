"""qgZ's two-hop int4 average against hand-computed values and an independent reference."""

from __future__ import annotations

import numpy as np
import pytest

from models.train.qgz import TwoHopAverager, qgz_group_count


def _ref_q4(flat: np.ndarray, group: int) -> np.ndarray:
    """int4 absmax round trip written out group by group (fp16 input, fp32 arithmetic)."""
    out = np.empty(flat.size, np.float32)
    for start in range(0, flat.size, group):
        x = flat[start : start + group].astype(np.float16).astype(np.float32)
        m = np.float32(np.abs(x).max())
        s = np.float32(8.0) / m if m > 0 else np.float32(1.0)
        q = np.clip(np.rint(x * s), -8, 7)
        out[start : start + group] = q.astype(np.float32) * (np.float32(1.0) / s)
    return out


def _ref_two_hop(grads: np.ndarray, nodes: int, per_node: int, groups: int) -> np.ndarray:
    shape = grads.shape[1:]
    group = int(np.prod(shape)) // groups
    node_results = []
    for n in range(nodes):
        acc = np.zeros(int(np.prod(shape)), np.float32)
        for w in range(n * per_node, (n + 1) * per_node):
            acc = acc + _ref_q4(grads[w].ravel(), group)
        node_results.append(_ref_q4(acc / np.float32(per_node), group))
    total = np.zeros_like(node_results[0])
    for r in node_results:
        total = total + r
    return (total / np.float32(nodes)).reshape(shape)


def test_hand_computed_two_hop_average() -> None:
    # Shape [2, 2] on 4 workers: 4 groups of one element, so each quantization maps a
    # positive x to 7/8 x (+m clips from 8 to 7) and a negative one to itself (-m is exact).
    grads = np.zeros((4, 2, 2), np.float32)
    grads[:, 0, 0] = [-1.0, -1.0, 2.0, 2.0]  # node 0: -1, -1; node 1: 2, 2
    averager = TwoHopAverager((2, 2), nodes=2, per_node=2)
    assert averager.groups == 4
    got = averager.average(grads)
    # node 0: mean(-1, -1) = -1, re-quantized exactly; node 1: mean(1.75, 1.75) = 1.75,
    # re-quantized to 7/8 * 1.75 = 1.53125; across nodes: (-1 + 1.53125) / 2.
    assert got[0, 0] == pytest.approx(0.265625, rel=1e-6)
    assert np.all(got.ravel()[1:] == 0.0)


def test_matches_reference_on_random_gradients() -> None:
    rng = np.random.default_rng(11)
    for shape, nodes, per_node in [((16, 40), 2, 4), ((8, 3, 3, 3), 2, 2), ((10, 64), 4, 2)]:
        grads = (rng.standard_normal((nodes * per_node, *shape)) * 1e-2).astype(np.float32)
        averager = TwoHopAverager(shape, nodes, per_node)
        expected = _ref_two_hop(grads, nodes, per_node, averager.groups)
        np.testing.assert_array_equal(averager.average(grads), expected)
        # and it is an int4 approximation of the plain mean, not the mean itself
        plain = grads.mean(axis=0)
        err = np.abs(averager.average(grads) - plain).max()
        assert 0 < err < 0.3 * np.abs(plain).max()


def test_group_count_follows_deepspeed() -> None:
    assert qgz_group_count((64, 512), 8) == 512
    assert qgz_group_count((32, 16, 3, 3), 8) == 32
    assert qgz_group_count((2, 3), 8) == 3  # 8 does not divide 6 elements
    with pytest.raises(ValueError):
        qgz_group_count((16,), 8)


def test_error_feedback_removes_the_bias_of_repeated_quantization() -> None:
    grads = np.zeros((4, 2, 2), np.float32)
    grads[:, 0, 0] = [-1.0, -1.0, 2.0, 2.0]  # true mean 0.5
    plain = TwoHopAverager((2, 2), 2, 2)
    feedback = TwoHopAverager((2, 2), 2, 2, error_feedback=True)
    steps = 64
    without = np.mean([plain.average(grads)[0, 0] for _ in range(steps)])
    with_ef = np.mean([feedback.average(grads)[0, 0] for _ in range(steps)])
    assert without == pytest.approx(0.265625, rel=1e-6)  # the same loss every step
    assert abs(with_ef - 0.5) < 0.02  # the error is carried over, so the mean converges
