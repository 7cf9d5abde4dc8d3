"""Both backends on every demo model, against the NumPy reference; real sessions throughout."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from models.backends import load_runtime
from models.demo import FLOAT_DEMO_MODELS, DemoModel
from models.repository import ModelConfig, ModelVersion
from models.runtime import InferenceFailed, ModelLoadError, Runtime, Threads
from models.zoo import init_weights, reference_forward

# The fp32 exports; their quantized checkpoints are checked in test_quant_backends.py.
MODEL_NAMES = [m.name for m in FLOAT_DEMO_MODELS]
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def runtimes(demo_versions: dict[str, ModelVersion]) -> Iterator[dict[str, Runtime]]:
    """One session per demo model, shared by the read-only tests of this module."""
    opened = {name: load_runtime(demo_versions[name], Threads(1, 1)) for name in MODEL_NAMES}
    yield opened
    for rt in opened.values():
        rt.close()


def _random_inputs(model: DemoModel, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        i.name: rng.standard_normal((batch, *i.shape)).astype(np.float32) for i in model.spec.inputs
    }


@pytest.mark.parametrize("batch", [1, 7])
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_matches_reference_forward(
    name: str, batch: int, runtimes: dict[str, Runtime], demo_models: dict[str, DemoModel]
) -> None:
    model = demo_models[name]
    inputs = _random_inputs(model, batch, seed=batch)
    out = runtimes[name].infer(inputs)
    assert list(out) == [model.spec.output]
    got = out[model.spec.output]
    assert got.dtype == np.float32
    assert got.shape == (batch, *model.spec.output_shape)
    expected = reference_forward(model.spec, init_weights(model.spec), inputs)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_metadata(
    name: str, runtimes: dict[str, Runtime], demo_models: dict[str, DemoModel]
) -> None:
    model = demo_models[name]
    rt = runtimes[name]
    assert isinstance(rt, Runtime)
    meta = rt.metadata
    assert (meta.name, meta.version) == (name, "1")
    assert meta.platform == (
        "onnxruntime_onnx" if model.runtime == "onnxruntime" else "tensorflow_savedmodel"
    )
    assert {(s.name, s.dtype, s.shape) for s in meta.inputs} == {
        (i.name, "float32", (-1, *i.shape)) for i in model.spec.inputs
    }
    assert [(s.name, s.dtype, s.shape) for s in meta.outputs] == [
        (model.spec.output, "float32", (-1, *model.spec.output_shape))
    ]
    assert rt.device in ("cpu", "cuda:0")


@pytest.mark.parametrize("name", ["sensor_mlp", "sensor_mlp_tf"])
def test_threads_recorded_and_close_idempotent(
    name: str, demo_versions: dict[str, ModelVersion], demo_models: dict[str, DemoModel]
) -> None:
    rt = load_runtime(demo_versions[name], Threads(intra_op=2, inter_op=2))
    assert rt.threads == Threads(2, 2)
    assert rt.infer(_random_inputs(demo_models[name], 3))["probabilities"].shape == (3, 8)
    rt.close()
    rt.close()
    with pytest.raises(InferenceFailed, match="closed"):
        rt.infer(_random_inputs(demo_models[name], 1))


@pytest.mark.parametrize("name", ["sensor_fusion", "sensor_fusion_tf"])
def test_bad_batches_raise_inference_failed(name: str, runtimes: dict[str, Runtime]) -> None:
    rt = runtimes[name]
    with pytest.raises(InferenceFailed, match=name):
        rt.infer({"accel": np.zeros((2, 3), np.float32)})  # temperature missing
    with pytest.raises(InferenceFailed):
        rt.infer(
            {"accel": np.zeros((2, 5), np.float32), "temperature": np.zeros((2, 1), np.float32)}
        )


def _version(tmp_path: Path, runtime: str, path: str) -> ModelVersion:
    directory = tmp_path / "broken" / "1"
    directory.mkdir(parents=True)
    config = ModelConfig.model_validate({"runtime": runtime, "path": path})
    return ModelVersion("broken", 1, directory, config)


def test_corrupt_onnx_file_is_a_load_error(tmp_path: Path) -> None:
    version = _version(tmp_path, "onnxruntime", "model.onnx")
    version.model_path.write_bytes(b"\x08\x07this is not a protobuf model")
    with pytest.raises(ModelLoadError, match=r"'broken' version 1.*model\.onnx"):
        load_runtime(version, Threads(1, 1))


def test_missing_onnx_file_is_a_load_error(tmp_path: Path) -> None:
    version = _version(tmp_path, "onnxruntime", "model.onnx")
    with pytest.raises(ModelLoadError, match=r"model\.onnx does not exist"):
        load_runtime(version, Threads(1, 1))


def test_missing_savedmodel_is_a_load_error(tmp_path: Path) -> None:
    version = _version(tmp_path, "tensorflow", "model.savedmodel")
    with pytest.raises(ModelLoadError, match=r"'broken' version 1.*model\.savedmodel"):
        load_runtime(version, Threads(1, 1))


def test_corrupt_savedmodel_is_a_load_error(tmp_path: Path) -> None:
    version = _version(tmp_path, "tensorflow", "model.savedmodel")
    version.model_path.mkdir()
    (version.model_path / "saved_model.pb").write_bytes(b"garbage")
    with pytest.raises(ModelLoadError, match=r"model\.savedmodel"):
        load_runtime(version, Threads(1, 1))


def test_importing_backends_does_not_import_tensorflow() -> None:
    code = "import sys, models.backends; assert 'tensorflow' not in sys.modules, 'imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO_ROOT, timeout=60)


def _thread_ticks() -> dict[str, int]:
    """CPU time (clock ticks) of each thread of this process, from /proc."""
    ticks = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            stat = Path(f"/proc/self/task/{tid}/stat").read_text()
        except FileNotFoundError:
            continue  # the thread ended meanwhile
        fields = stat.rsplit(")", 1)[1].split()  # the name in parentheses may hold spaces
        ticks[tid] = int(fields[11]) + int(fields[12])  # utime + stime
    return ticks


def _busy_threads(rt: Runtime, inputs: dict[str, np.ndarray]) -> int:
    """How many threads did a real share (a quarter or more) of the CPU work of a few batches.

    Counting threads rather than comparing wall-clock times keeps this meaningful when other
    processes compete for the cores: they slow each thread down but do not merge them.
    """
    rt.infer(inputs)  # warm-up
    before = _thread_ticks()
    for _ in range(3):
        rt.infer(inputs)
    used = [t - before.get(tid, 0) for tid, t in _thread_ticks().items()]
    return sum(1 for u in used if u >= 0.25 * sum(used))


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_tensorflow_intra_op_threads_are_per_session(
    demo_versions: dict[str, ModelVersion], demo_models: dict[str, DemoModel]
) -> None:
    """Without TF_OVERRIDE_GLOBAL_THREADPOOL, the first session fixes one process-wide pool and
    a later session's intra-op setting is silently ignored: both would compute on one thread."""
    assert os.environ.get("TF_OVERRIDE_GLOBAL_THREADPOOL") == "1"
    inputs = _random_inputs(demo_models["vision_cnn_tf"], 16)
    one = load_runtime(demo_versions["vision_cnn_tf"], Threads(1, 1))
    two = load_runtime(demo_versions["vision_cnn_tf"], Threads(2, 1))
    try:
        assert _busy_threads(one, inputs) == 1
        assert _busy_threads(two, inputs) == 2
    finally:
        one.close()
        two.close()
