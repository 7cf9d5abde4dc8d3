"""Importers: safetensors state dicts (one file and sharded), Keras models, fp32 ONNX models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from safetensors.numpy import save_file

from models.backends import load_runtime
from models.checkpoint import QuantizedTensor, load_checkpoint, save_checkpoint
from models.export_onnx import export_onnx
from models.importers.from_onnx import import_onnx
from models.importers.from_safetensors import import_state_dict
from models.importers.report import ImportFailed, QuantOptions
from models.quant import quantize_blocks
from models.repository import ModelConfig, ModelVersion
from models.runtime import ModelLoadError, Threads
from models.spec_codec import spec_to_doc
from models.zoo import (
    SENSOR_MLP,
    VISION_CNN,
    Conv2D,
    Dense,
    Flatten,
    Input,
    ModelSpec,
    init_weights,
    reference_forward,
)
from models.zoo_checkpoint import dequantized_weights, to_output_major, zoo_params

KEEP_ALL_FLOAT = ("*",)


def _torch_state_dict(spec: ModelSpec, names: list[str]) -> dict[str, np.ndarray]:
    """The zoo weights of ``spec`` as a PyTorch state dict (output-major) under ``names``."""
    state = {}
    params = [(layer, p) for layer, p in zip(spec.layers, init_weights(spec), strict=True) if p]
    for name, (layer, p) in zip(names, params, strict=True):
        state[f"{name}.weight"] = to_output_major(layer, p.kernel)
        state[f"{name}.bias"] = p.bias
    return state


def _mapping(spec: ModelSpec, names: list[str]) -> dict[str, Any]:
    doc = spec_to_doc(spec)
    it = iter(names)
    for layer in doc["layers"]:
        if layer["type"] in ("dense", "conv2d"):
            name = next(it)
            layer.update(weight=f"{name}.weight", bias=f"{name}.bias")
    return doc


MLP_NAMES = ["fc1", "fc2", "head"]


def test_state_dict_import_is_the_quantizer_on_the_source_weights(tmp_path: Path) -> None:
    state = _torch_state_dict(SENSOR_MLP, MLP_NAMES)
    state["num_batches_tracked"] = np.zeros(1, np.float32)
    save_file(state, str(tmp_path / "model.safetensors"))
    mapping = tmp_path / "mapping.json"
    mapping.write_text(json.dumps(_mapping(SENSOR_MLP, MLP_NAMES)))
    checkpoint, report = import_state_dict(tmp_path, mapping, QuantOptions(8, 16))
    for index, name in zip((0, 1, 2), MLP_NAMES, strict=True):
        tensor = checkpoint.tensors[f"layers.{index}.weight"]
        assert isinstance(tensor, QuantizedTensor)
        expected = quantize_blocks(state[f"{name}.weight"], 8, 16)
        assert np.array_equal(tensor.data.codes, expected.codes)
        assert np.array_equal(tensor.data.scales, expected.scales)
        bias = checkpoint.tensors[f"layers.{index}.bias"]
        assert isinstance(bias, np.ndarray) and np.array_equal(bias, state[f"{name}.bias"])
    assert [d.name for d in report.quantized] == [
        "layers.0.weight (from fc1.weight)",
        "layers.1.weight (from fc2.weight)",
        "layers.2.weight (from head.weight)",
    ]
    assert report.quantized[0].detail == "int8, 64 rows x 2 block(s) of 16 along 32 inputs"
    assert {d.name for d in report.kept_float} == {
        f"layers.{i}.bias (from {n}.bias)" for i, n in enumerate(MLP_NAMES)
    }
    assert any("num_batches_tracked" in n for n in report.notes)
    text = report.format()
    assert "quantized (3)" in text and "kept in float (3)" in text


def test_sharded_state_dict_gives_the_same_checkpoint(tmp_path: Path) -> None:
    state = _torch_state_dict(SENSOR_MLP, MLP_NAMES)
    mapping = _mapping(SENSOR_MLP, MLP_NAMES)
    single, sharded = tmp_path / "single", tmp_path / "sharded"
    single.mkdir()
    sharded.mkdir()
    save_file(state, str(single / "model.safetensors"))
    names = sorted(state)
    shards = {
        "model-00001-of-00002.safetensors": names[:3],
        "model-00002-of-00002.safetensors": names[3:],
    }
    weight_map: dict[str, str] = {}
    for file, keys in shards.items():
        save_file({k: state[k] for k in keys}, str(sharded / file))
        weight_map |= dict.fromkeys(keys, file)
    (sharded / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map})
    )
    options = QuantOptions(4, 32, keep_float=("layers.2.*",))
    a, _ = import_state_dict(single / "model.safetensors", mapping, options)
    b, report = import_state_dict(sharded / "model.safetensors.index.json", mapping, options)
    assert "2 shards" in report.source
    assert "layers.2.weight (from head.weight)" in {d.name for d in report.kept_float}
    x = save_checkpoint(a, tmp_path / "a.safetensors")
    y = save_checkpoint(b, tmp_path / "b.safetensors")
    assert x.read_bytes() == y.read_bytes()
    # a shard gone, or a name the index promises but the shard lacks
    (sharded / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ImportFailed, match=r"model-00002-of-00002\.safetensors.*missing"):
        import_state_dict(sharded, mapping, options)


CNN = ModelSpec(
    name="torch_cnn",
    inputs=(Input("image", (6, 5, 2)),),
    layers=(Conv2D(3, 3, padding="valid"), Flatten(), Dense(4)),
    seed=9,
)


def test_pytorch_cnn_flatten_order(tmp_path: Path) -> None:
    """PyTorch flattens (C, H, W); the importer reorders the next Linear's columns to the zoo's
    (H, W, C), so the imported model computes what the PyTorch one does."""
    weights = init_weights(CNN)
    conv, dense = weights[0], weights[2]
    assert conv is not None and dense is not None
    h, w, c = 4, 3, 3  # the conv's output
    torch_dense = dense.kernel.T.reshape(4, h, w, c).transpose(0, 3, 1, 2).reshape(4, -1)
    state = {
        "conv.weight": to_output_major(CNN.layers[0], conv.kernel),
        "conv.bias": conv.bias,
        "fc.weight": np.ascontiguousarray(torch_dense),
        "fc.bias": dense.bias,
    }
    save_file(state, str(tmp_path / "model.safetensors"))
    mapping = spec_to_doc(CNN)
    mapping["layers"][0] |= {"weight": "conv.weight", "bias": "conv.bias"}
    mapping["layers"][1] |= {"order": "chw"}
    mapping["layers"][2] |= {"weight": "fc.weight", "bias": "fc.bias"}
    checkpoint, report = import_state_dict(
        tmp_path / "model.safetensors", mapping, QuantOptions(8, 16, keep_float=KEEP_ALL_FLOAT)
    )
    assert any("(C, H, W) to (H, W, C)" in n for n in report.notes)
    spec, params = zoo_params(checkpoint, tmp_path)
    for got, want in zip(dequantized_weights(spec, params), weights, strict=True):
        if want is not None:
            assert got is not None and np.array_equal(got.kernel, want.kernel)
    mapping["layers"][1]["order"] = "hwc"  # the wrong order: the dense kernel no longer matches
    wrong, _ = import_state_dict(
        tmp_path / "model.safetensors", mapping, QuantOptions(8, 16, keep_float=KEEP_ALL_FLOAT)
    )
    _, wrong_params = zoo_params(wrong, tmp_path)
    wrong_dense = dequantized_weights(spec, wrong_params)[2]
    assert wrong_dense is not None
    assert not np.array_equal(wrong_dense.kernel, dense.kernel)


def test_fp16_state_dict(tmp_path: Path) -> None:
    state = {k: v.astype(np.float16) for k, v in _torch_state_dict(SENSOR_MLP, MLP_NAMES).items()}
    save_file(state, str(tmp_path / "model.safetensors"))
    checkpoint, _ = import_state_dict(
        tmp_path, _mapping(SENSOR_MLP, MLP_NAMES), QuantOptions(4, 16)
    )
    path = save_checkpoint(checkpoint, tmp_path / "ckpt.safetensors")
    loaded = load_checkpoint(path)
    weight = loaded.tensors["layers.0.weight"]
    assert isinstance(weight, QuantizedTensor) and weight.dtype == "float16"
    assert loaded.tensors["layers.0.bias"].dtype == np.float16  # kept as it came
    assert np.array_equal(weight.data.codes, quantize_blocks(state["fc1.weight"], 4, 16).codes)


def test_state_dict_errors_name_the_tensor(tmp_path: Path) -> None:
    state = _torch_state_dict(SENSOR_MLP, MLP_NAMES)
    state["fc2.weight"] = np.zeros((8, 64), np.float32)
    save_file(state, str(tmp_path / "model.safetensors"))
    mapping = _mapping(SENSOR_MLP, MLP_NAMES)
    with pytest.raises(
        ImportFailed, match=r"'fc2.weight' has shape \[8, 64\]; layer 1 .* \[64, 64\]"
    ):
        import_state_dict(tmp_path, mapping, QuantOptions(8, 16))
    mapping["layers"][0]["weight"] = "encoder.fc1.weight"
    with pytest.raises(ImportFailed, match=r"no tensor 'encoder\.fc1\.weight'"):
        import_state_dict(tmp_path, mapping, QuantOptions(8, 16))
    del mapping["layers"][0]["weight"]
    with pytest.raises(ImportFailed, match=r"layers\[0\] \(dense\) needs a 'weight'"):
        import_state_dict(tmp_path, mapping, QuantOptions(8, 16))
    (tmp_path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{")
    with pytest.raises(ImportFailed, match="not a valid safetensors file"):
        import_state_dict(tmp_path, _mapping(SENSOR_MLP, MLP_NAMES), QuantOptions(8, 16))
    with pytest.raises(ImportFailed, match="block_size"):
        QuantOptions(4, 100)


# -- Keras ------------------------------------------------------------------------------------


def test_keras_import(tmp_path: Path) -> None:
    # from_keras first: it sets the environment TensorFlow reads when it is first imported.
    from models.importers.from_keras import import_keras  # isort: skip
    import keras

    keras.utils.set_random_seed(3)
    model = keras.Sequential(
        [
            keras.Input((8, 8, 3), name="image"),
            keras.layers.Conv2D(8, 3, padding="same"),
            keras.layers.Activation("relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Conv2D(16, 3, strides=2, padding="valid", activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dropout(0.5),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(5, activation="softmax"),
        ],
        name="keras_cnn",
    )
    saved = tmp_path / "model.keras"
    model.save(saved)
    checkpoint, report = import_keras(saved, QuantOptions(8, 16))
    assert len(report.quantized) == 4 and len(report.kept_float) == 4
    assert any("Dropout" in n for n in report.notes)
    spec, params = zoo_params(checkpoint, saved)
    assert spec.inputs == (Input("image", (8, 8, 3)),) and spec.softmax
    assert spec.layers[0] == Conv2D(8, 3, 1, "same", "relu")  # the ReLU layer folded in
    # Keras with the dequantized weights computes what the checkpoint's reference does.
    deq = dequantized_weights(spec, params)
    model.set_weights([a for p in deq if p is not None for a in (p.kernel, p.bias)])
    x = np.random.default_rng(0).standard_normal((6, 8, 8, 3)).astype(np.float32)
    expected = model.predict(x, verbose=0)
    np.testing.assert_allclose(reference_forward(spec, deq, {"image": x}), expected, atol=1e-5)
    path = save_checkpoint(checkpoint, tmp_path / "1" / "model.safetensors")
    version = ModelVersion(
        "keras",
        1,
        path.parent,
        ModelConfig(runtime="tensorflow", path=path.name, format="checkpoint"),
    )
    rt = load_runtime(version, Threads(1, 1))
    try:
        np.testing.assert_allclose(rt.infer({"image": x})["probabilities"], expected, atol=1e-5)
    finally:
        rt.close()


def test_keras_unsupported_layers_are_named() -> None:
    # from_keras first: it sets the environment TensorFlow reads when it is first imported.
    from models.importers.from_keras import import_keras  # isort: skip
    import keras

    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(3), keras.layers.BatchNormalization(name="bn")]
    )
    with pytest.raises(ImportFailed, match=r"bn \(BatchNormalization\) has no counterpart"):
        import_keras(model, QuantOptions(8, 16))
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(3, activation="tanh", name="d")]
    )
    with pytest.raises(ImportFailed, match="d: activation 'tanh'"):
        import_keras(model, QuantOptions(8, 16))


# -- ONNX -------------------------------------------------------------------------------------


def _dequantized_float_model(source: Path, checkpoint_path: Path) -> bytes:
    """The source ONNX model with each quantized weight replaced by its dequantized values:
    what the rewritten graph must compute."""
    model = onnx.load(str(source))
    loaded = load_checkpoint(checkpoint_path)
    consumers = {n.input[1]: n for n in model.graph.node if len(n.input) > 1}
    for init in model.graph.initializer:
        tensor = loaded.tensors.get(init.name)
        if isinstance(tensor, QuantizedTensor):
            values = tensor.dequantize()  # output-major
            node = consumers[init.name]
            transposed = node.op_type == "MatMul" or (
                node.op_type == "Gemm"
                and not any(a.name == "transB" and a.i for a in node.attribute)
            )
            if transposed:
                values = values.T
            init.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(values), init.name))
    return model.SerializeToString()


def _serve_and_compare(source: Path, checkpoint_path: Path, feed: dict[str, np.ndarray]) -> None:
    expected = ort.InferenceSession(
        _dequantized_float_model(source, checkpoint_path), providers=["CPUExecutionProvider"]
    ).run(None, feed)[0]
    config = ModelConfig(
        runtime="onnxruntime", path=checkpoint_path.name, format="checkpoint", accuracy_level=0
    )
    rt = load_runtime(ModelVersion("imported", 1, checkpoint_path.parent, config), Threads(1, 1))
    try:
        got = next(iter(rt.infer(feed).values()))
    finally:
        rt.close()
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("bits", [4, 3])
def test_onnx_import_of_a_cnn(bits: int, tmp_path: Path) -> None:
    source = export_onnx(VISION_CNN, init_weights(VISION_CNN), tmp_path / "cnn.onnx")
    checkpoint, report = import_onnx(source, QuantOptions(bits, 32))
    assert {d.name for d in report.quantized} == {
        f"l{i}_kernel" for i in (0, 1, 2, 4, 5, 7, 8, 11, 12)
    }
    assert all(d.detail.startswith(("Conv", "Gemm")) for d in report.quantized)
    assert {d.name for d in report.kept_float} == {
        f"l{i}_bias" for i in (0, 1, 2, 4, 5, 7, 8, 11, 12)
    }
    assert report.notes == ("converted from opset 17 to 21 (blocked DequantizeLinear)",)
    path = save_checkpoint(checkpoint, tmp_path / "1" / "model.safetensors")
    x = np.random.default_rng(1).standard_normal((3, 32, 32, 3)).astype(np.float32)
    _serve_and_compare(source, path, {"image": x})
    config = ModelConfig(runtime="tensorflow", path=path.name, format="checkpoint")
    with pytest.raises(ModelLoadError, match="only ONNX Runtime serves"):
        load_runtime(ModelVersion("imported", 1, path.parent, config), Threads(1, 1))


def _hand_built(path: Path) -> Path:
    """MatMul with B [K, N] then Add; Gemm with transB and a [1, N] C; a weight two nodes share;
    an fp16 weight; a Gemm with alpha != 1."""
    rng = np.random.default_rng(2)

    def init(name: str, shape: tuple[int, ...], dtype: type = np.float32) -> onnx.TensorProto:
        return numpy_helper.from_array(rng.standard_normal(shape).astype(dtype), name)

    nodes = [
        helper.make_node("MatMul", ["x", "w_mm"], ["mm"]),
        helper.make_node("Add", ["mm", "b_mm"], ["h1"]),
        helper.make_node("Gemm", ["h1", "w_gemm", "c_gemm"], ["h2"], transB=1),
        helper.make_node("MatMul", ["h2", "w_shared"], ["h3"]),
        helper.make_node("MatMul", ["h3", "w_shared"], ["h4"]),
        helper.make_node("Cast", ["h4"], ["h4_half"], to=TensorProto.FLOAT16),
        helper.make_node("MatMul", ["h4_half", "w_half"], ["h5_half"]),
        helper.make_node("Cast", ["h5_half"], ["h5"], to=TensorProto.FLOAT),
        helper.make_node("Gemm", ["h5", "w_alpha"], ["y"], alpha=0.5),
    ]
    graph = helper.make_graph(
        nodes,
        "hand",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 40])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 6])],
        initializer=[
            init("w_mm", (40, 24)),
            init("b_mm", (24,)),
            init("w_gemm", (16, 24)),
            init("c_gemm", (1, 16)),
            init("w_shared", (16, 16)),
            init("w_half", (16, 16), np.float16),
            init("w_alpha", (16, 6)),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("bits", [8, 6])
def test_onnx_import_rules(bits: int, tmp_path: Path) -> None:
    source = _hand_built(tmp_path / "hand.onnx")
    checkpoint, report = import_onnx(source, QuantOptions(bits, 16))
    assert {d.name for d in report.quantized} == {"w_mm", "w_gemm"}
    reasons = {d.name: d.detail for d in report.kept_float}
    assert "several nodes" in reasons["w_shared"]
    assert "FLOAT16" in reasons["w_half"]
    assert "alpha" in reasons["w_alpha"]
    assert "bias, norm" in reasons["b_mm"] and "bias, norm" in reasons["c_gemm"]
    assert report.notes == ()  # opset 21 already
    w_mm = checkpoint.tensors["w_mm"]
    assert isinstance(w_mm, QuantizedTensor) and w_mm.shape == (24, 40)  # stored [N, K]
    path = save_checkpoint(checkpoint, tmp_path / "1" / "model.safetensors")
    x = np.random.default_rng(4).standard_normal((5, 40)).astype(np.float32)
    _serve_and_compare(source, path, {"x": x})


def test_onnx_import_refuses_garbage(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(ImportFailed, match="not a valid ONNX model"):
        import_onnx(bad, QuantOptions(4, 32))


# A PyTorch module as its author writes it: forward() applies ReLU after fc1 and fc2 and returns
# the head's output as it is (logits); none of that is in the state dict, so the mapping says
# it, and leaves the head's activation and the softmax to their documented defaults.
TORCH_MLP_MAPPING: dict[str, Any] = {
    "name": "torch_mlp",
    "inputs": [{"name": "features", "shape": [32]}],
    "layers": [
        {
            "type": "dense",
            "units": 64,
            "activation": "relu",
            "weight": "fc1.weight",
            "bias": "fc1.bias",
        },
        {
            "type": "dense",
            "units": 48,
            "activation": "relu",
            "weight": "fc2.weight",
            "bias": "fc2.bias",
        },
        {"type": "dense", "units": 10, "weight": "head.weight", "bias": "head.bias"},
    ],
}


def _torch_mlp(tmp_path: Path) -> dict[str, np.ndarray]:
    """nn.Linear's default initialisation, U(-1/sqrt(in), 1/sqrt(in)), saved as a state dict."""
    rng = np.random.default_rng(5)
    state = {}
    for name, n_in, n_out in (("fc1", 32, 64), ("fc2", 64, 48), ("head", 48, 10)):
        bound = 1 / np.sqrt(n_in)
        state[f"{name}.weight"] = rng.uniform(-bound, bound, (n_out, n_in)).astype(np.float32)
        state[f"{name}.bias"] = rng.uniform(-bound, bound, n_out).astype(np.float32)
    save_file(state, str(tmp_path / "model.safetensors"))
    return state


def _torch_logits(state: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    h = np.maximum(x @ state["fc1.weight"].T + state["fc1.bias"], 0)
    h = np.maximum(h @ state["fc2.weight"].T + state["fc2.bias"], 0)
    return np.asarray(h @ state["head.weight"].T + state["head.bias"])


@pytest.mark.parametrize(
    ("options", "tolerance"),
    [(QuantOptions(8, 16, KEEP_ALL_FLOAT), 1e-5), (QuantOptions(8, 16), 0.02)],
    ids=["float", "int8"],
)
def test_a_pytorch_mlp_with_a_linear_head_comes_back_as_its_logits(
    tmp_path: Path, options: QuantOptions, tolerance: float
) -> None:
    state = _torch_mlp(tmp_path)
    checkpoint, report = import_state_dict(tmp_path, TORCH_MLP_MAPPING, options)
    path = save_checkpoint(checkpoint, tmp_path / "out" / "model.safetensors")
    config = ModelConfig(
        runtime="onnxruntime", path=path.name, format="checkpoint", accuracy_level=0
    )
    x = np.random.default_rng(6).standard_normal((256, 32)).astype(np.float32)
    expected = _torch_logits(state, x)
    rt = load_runtime(ModelVersion("torch_mlp", 1, path.parent, config), Threads(1, 1))
    try:
        got = rt.infer({"features": x})
    finally:
        rt.close()
    assert list(got) == ["logits"]
    logits = got["logits"]
    # Logits, not probabilities: no row sums to 1, values as the fp32 model's.
    assert np.mean(logits.argmax(axis=1) == expected.argmax(axis=1)) == 1.0
    np.testing.assert_allclose(logits, expected, atol=tolerance * np.abs(expected).max())
    assert report.architecture == (
        "layers[0] dense 64, activation relu <- fc1.weight, fc1.bias",
        "layers[1] dense 48, activation relu <- fc2.weight, fc2.bias",
        "layers[2] dense 10, activation linear <- head.weight, head.bias "
        "(activation: default of the last layer)",
        "output 'logits': no softmax (logits)",
    )
    text = report.format()
    assert "activation relu" in text and "no softmax" in text


def test_softmax_is_appended_only_when_the_mapping_says_so(tmp_path: Path) -> None:
    state = _torch_mlp(tmp_path)
    mapping = {**TORCH_MLP_MAPPING, "softmax": True}
    checkpoint, report = import_state_dict(tmp_path, mapping, QuantOptions(8, 16, ("*",)))
    assert report.architecture[-1] == "output 'probabilities': softmax appended (probabilities)"
    path = save_checkpoint(checkpoint, tmp_path / "out" / "model.safetensors")
    config = ModelConfig(runtime="onnxruntime", path=path.name, format="checkpoint")
    x = np.random.default_rng(7).standard_normal((8, 32)).astype(np.float32)
    rt = load_runtime(ModelVersion("torch_mlp", 1, path.parent, config), Threads(1, 1))
    try:
        probabilities = rt.infer({"features": x})["probabilities"]
    finally:
        rt.close()
    logits = _torch_logits(state, x)
    softmax = np.exp(logits - logits.max(axis=1, keepdims=True))
    softmax /= softmax.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(probabilities, softmax, rtol=1e-4, atol=1e-6)


def test_a_hidden_layer_without_an_activation_is_refused_naming_the_key(tmp_path: Path) -> None:
    _torch_mlp(tmp_path)
    layers = [dict(layer) for layer in TORCH_MLP_MAPPING["layers"]]
    del layers[1]["activation"]
    mapping = {**TORCH_MLP_MAPPING, "layers": layers}
    with pytest.raises(
        ImportFailed, match=r"layers\[1\] \(dense 'fc2.weight'\) needs an 'activation' key"
    ):
        import_state_dict(tmp_path, mapping, QuantOptions(8, 16))
