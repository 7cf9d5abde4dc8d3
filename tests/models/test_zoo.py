"""The zoo's shape logic, weights and NumPy reference forward."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from models.export_onnx import BATCH_DIM, OPSET, build_onnx
from models.zoo import (
    DEMO_SPECS,
    SENSOR_FUSION,
    VISION_CNN,
    Conv2D,
    Dense,
    Flatten,
    Input,
    MaxPool2D,
    ModelSpec,
    init_weights,
    layer_shapes,
    reference_forward,
    same_pads,
)


def test_same_pads_follow_tensorflow() -> None:
    # TF "SAME": output ceil(n/s), the odd padding pixel goes after.
    assert same_pads(32, 3, 1) == (1, 1)
    assert same_pads(32, 3, 2) == (0, 1)
    assert same_pads(5, 4, 1) == (1, 2)
    assert same_pads(4, 1, 2) == (0, 0)


def test_layer_shapes_of_the_cnn() -> None:
    shapes = layer_shapes(VISION_CNN)
    assert shapes[-1] == (10,)
    assert (4, 4, 256) in shapes  # three 2x2 poolings of 32x32


@pytest.mark.parametrize(
    ("inputs", "layers", "message"),
    [
        ((Input("x", (8, 8, 3)),), (Dense(4),), "Dense needs a vector"),
        ((Input("x", (8,)),), (Conv2D(4, 3),), "needs an HWC input"),
        ((Input("x", (2, 2, 1)),), (Conv2D(4, 3, padding="valid"), Flatten()), "larger than"),
        ((Input("x", (4, 4, 1)),), (MaxPool2D(2),), "must produce a vector"),
        ((Input("a", (2, 2, 1)), Input("b", (1,))), (Flatten(),), "feature vectors"),
    ],
)
def test_inconsistent_specs_are_refused(
    inputs: tuple[Input, ...], layers: tuple, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        ModelSpec("bad", inputs, layers)


def test_weights_are_deterministic_and_he_scaled() -> None:
    a, b = init_weights(VISION_CNN), init_weights(VISION_CNN)
    for pa, pb in zip(a, b, strict=True):
        assert (pa is None) == (pb is None)
        if pa is not None and pb is not None:
            assert np.array_equal(pa.kernel, pb.kernel)
            assert pa.kernel.dtype == np.float32
    first = a[0]
    assert first is not None
    fan_in = 3 * 3 * 3
    assert first.kernel.std() == pytest.approx(np.sqrt(2 / fan_in), rel=0.15)


def _naive_conv_same(x: np.ndarray, kernel: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """Direct loops, stride 1, "same" padding: an independent check of the vectorised one."""
    n, h, w, _ = x.shape
    k = kernel.shape[0]
    top, left = (k - 1) // 2, (k - 1) // 2
    padded = np.pad(x, ((0, 0), (top, k - 1 - top), (left, k - 1 - left), (0, 0)))
    out = np.zeros((n, h, w, kernel.shape[3]))
    for i in range(h):
        for j in range(w):
            window = padded[:, i : i + k, j : j + k, :]
            out[:, i, j, :] = np.einsum("nhwc,hwcf->nf", window, kernel) + bias
    return out


def test_reference_conv_pool_flatten_against_loops() -> None:
    spec = ModelSpec(
        "tiny",
        (Input("x", (5, 6, 2)),),
        (Conv2D(3, 3, activation="linear"), MaxPool2D(2), Flatten()),
        softmax=False,
    )
    weights = init_weights(spec)
    x = np.random.default_rng(4).standard_normal((2, 5, 6, 2))
    conv = weights[0]
    assert conv is not None
    y = _naive_conv_same(x, conv.kernel.astype(np.float64), conv.bias)
    pooled = y[:, :4, :6].reshape(2, 2, 2, 3, 2, 3).max(axis=(2, 4))
    expected = pooled.reshape(2, -1)
    got = reference_forward(spec, weights, {"x": x})
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


def test_reference_concatenates_inputs_in_declaration_order() -> None:
    weights = init_weights(SENSOR_FUSION)
    rng = np.random.default_rng(5)
    accel = rng.standard_normal((3, 3))
    temp = rng.standard_normal((3, 1))
    probs = reference_forward(SENSOR_FUSION, weights, {"accel": accel, "temperature": temp})
    assert probs.shape == (3, 4)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0)
    h = np.concatenate([accel, temp], axis=1)
    p0, p1 = weights
    assert p0 is not None and p1 is not None
    logits = np.maximum(h @ p0.kernel + p0.bias, 0) @ p1.kernel + p1.bias
    np.testing.assert_allclose(np.log(probs) - np.log(probs[:, :1]), logits - logits[:, :1])


def test_reference_rejects_a_wrong_input_shape() -> None:
    with pytest.raises(ValueError, match="features"):
        reference_forward(DEMO_SPECS[0], init_weights(DEMO_SPECS[0]), {"features": np.ones((2, 3))})


@pytest.mark.parametrize("spec", DEMO_SPECS, ids=lambda s: s.name)
def test_onnx_graph_has_named_io_and_dynamic_batch(spec: ModelSpec) -> None:
    model = build_onnx(spec, init_weights(spec))
    assert model.opset_import[0].version == OPSET
    graph_inputs = {i.name: i for i in model.graph.input}
    assert list(graph_inputs) == [i.name for i in spec.inputs]
    for inp in spec.inputs:
        dims = graph_inputs[inp.name].type.tensor_type.shape.dim
        assert dims[0].dim_param == BATCH_DIM
        assert tuple(d.dim_value for d in dims[1:]) == inp.shape
    assert [o.name for o in model.graph.output] == [spec.output]
    onnx.checker.check_model(model)
