"""The demo repository's digits_cnn family is the trainer's output: the int8/int4 checkpoints
are the committed trained files byte for byte, and every runtime computes the trained model
on the digits test split."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from models.backends import load_runtime
from models.checkpoint import load_checkpoint
from models.demo import (
    TRAINED_DEMO_MODELS,
    DemoModel,
    ensure_demo_repository,
    model_weights,
)
from models.repository import ModelVersion, scan_repository
from models.runtime import Threads
from models.train.data import load_digits_split
from models.train.demo_weights import WEIGHTS_DIR
from models.train.export import checkpoint_weights
from models.zoo import reference_forward


@pytest.fixture(scope="module")
def trained_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_demo_repository(tmp_path_factory.mktemp("demo") / "repo", TRAINED_DEMO_MODELS)


def test_family_names() -> None:
    names = sorted(m.name for m in TRAINED_DEMO_MODELS)
    assert names == sorted(
        f"digits_cnn{q}{tf}" for q in ("", "_int8", "_int4") for tf in ("", "_tf")
    )


@pytest.mark.parametrize("model", TRAINED_DEMO_MODELS, ids=lambda m: m.name)
def test_demo_digits_model_computes_the_trained_model(model: DemoModel, trained_repo: Path) -> None:
    assert model.trained is not None
    source = WEIGHTS_DIR / model.trained[0]
    version = next(
        v
        for v in scan_repository(trained_repo)
        if isinstance(v, ModelVersion) and v.name == model.name
    )
    if model.bits is not None:
        # no PTQ on the way: the served file is the trainer's checkpoint as it was written
        assert version.model_path.read_bytes() == source.read_bytes()
        spec, weights = checkpoint_weights(load_checkpoint(source), source)
    else:
        spec, weights = model.spec, model_weights(model)
    test = load_digits_split().test
    expected = reference_forward(spec, weights, {"image": test.x})
    runtime = load_runtime(version, Threads(1, 1))
    try:
        got = runtime.infer({"image": test.x})["probabilities"]
    finally:
        runtime.close()
    agree = np.mean(got.argmax(axis=1) == expected.argmax(axis=1))
    # ONNX Runtime's MatMulNBits at accuracy_level 4 quantizes activations to int8
    assert agree == 1.0 if (model.bits is None or model.runtime == "tensorflow") else agree >= 0.99
    if model.bits is None or model.runtime == "tensorflow":
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    assert np.mean(got.argmax(axis=1) == test.y) >= 0.97
