"""The training loop: determinism, resume, and tiny-budget runs of the real command."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gateway.cli import main as iotgw
from models.checkpoint import QuantizedTensor, load_checkpoint
from models.train.simigrad import SimiGradConfig
from models.train.trainer import TrainConfig, Trainer

SIMI = SimiGradConfig(target=0.9, min_micro_batch=2, max_micro_batch=16)
# Two nodes of one worker each: both qgZ hops and both SimiGrad halves, and a step traced in
# a fraction of the time eight workers take.
SMALL: dict[str, Any] = {"nodes": 2, "per_node": 1}
CONFIG = TrainConfig(
    bits=4, micro_batch=2, simigrad=SIMI, error_feedback=True, eval_every=2, **SMALL
)


def _params(trainer: Trainer) -> list[np.ndarray]:
    return [v.numpy() for v in trainer.network.parameters]


def test_same_seed_same_weights_other_seed_other_weights() -> None:
    runs = []
    for seed in (0, 0, 1):
        trainer = Trainer(TrainConfig(bits=8, micro_batch=2, eval_every=0, seed=seed, **SMALL))
        for _ in range(3):
            trainer.train_step()
        runs.append(_params(trainer))
    for a, b in zip(runs[0], runs[1], strict=True):
        np.testing.assert_array_equal(a, b)
    assert any(np.any(a != c) for a, c in zip(runs[0], runs[2], strict=True))


def test_resume_ends_where_an_uninterrupted_run_does(tmp_path: Path) -> None:
    whole = Trainer(CONFIG)
    for _ in range(6):
        whole.train_step()

    first = Trainer(CONFIG)
    for _ in range(3):
        first.train_step()
    first.save_state(tmp_path / "state")
    del first
    resumed = Trainer.resume(tmp_path / "state")
    for _ in range(3):
        resumed.train_step()

    for a, b in zip(_params(whole), _params(resumed), strict=True):
        np.testing.assert_array_equal(a, b)
    assert resumed.history.steps == whole.history.steps
    assert resumed.history.evals == whole.history.evals
    assert len({s.batch for s in whole.history.steps}) > 1  # SimiGrad really moved it
    assert resumed.micro_batch == whole.micro_batch
    for position, codes in whole.served_codes().items():
        np.testing.assert_array_equal(codes.data.codes, resumed.served_codes()[position].data.codes)


def test_step_log_and_learning_rate_scaling() -> None:
    trainer = Trainer(TrainConfig(bits=8, micro_batch=4, simigrad=SIMI, eval_every=0, **SMALL))
    first = trainer.train_step()
    second = trainer.train_step()
    assert first.batch == 8 and first.lr == pytest.approx(CONFIG.lr)
    assert -1.0 <= first.similarity <= 1.0
    assert second.lr == pytest.approx(CONFIG.lr * np.sqrt(second.batch / 8))


@pytest.mark.parametrize(
    "flags",
    [
        ["--bits", "none", "--no-qgz"],  # all off
        ["--bits", "4", "--simigrad", "--error-feedback"],  # all on
        ["--bits", "2", "--no-qgz", "--simigrad", "--nodes", "1", "--per-node", "2"],
    ],
)
def test_tiny_training_command(flags: list[str], tmp_path: Path) -> None:
    def train(name: str, steps: int) -> list[str]:
        """Arguments of a fresh run of ``steps`` steps writing ``name``.{safetensors,jsonl}."""
        argv = ["train", *flags, "--max-steps", str(steps), "--micro-batch", "2", "--no-progress"]
        if "--nodes" not in flags:
            argv += ["--nodes", "2", "--per-node", "1"]
        return [*argv, *_outputs(tmp_path, name), "--state", str(tmp_path / name)]

    assert iotgw(train("first", 3)) == 0
    assert len(_steps(tmp_path / "first.jsonl")) == 3
    checkpoint = load_checkpoint(tmp_path / "first.safetensors")
    kernels = [t for n, t in checkpoint.tensors.items() if n.endswith(".weight")]
    quantized = [isinstance(t, QuantizedTensor) for t in kernels]
    assert all(quantized) if flags[1] != "none" else not any(quantized)
    assert (tmp_path / "first" / "state.json").is_file()
    resumed = ["train", "--resume", "--state", str(tmp_path / "first"), "--max-steps", "5"]
    assert iotgw([*resumed, "--no-progress", *_outputs(tmp_path, "resumed")]) == 0
    # The resumed run went on from step 3 (steps 4 and 5: the second computes with what the
    # first's update made of the restored state) and ends exactly where a run of 5 steps never
    # interrupted does: same step log, same exported bytes.
    assert iotgw(train("whole", 5)) == 0
    assert [s["step"] for s in _steps(tmp_path / "resumed.jsonl")] == [4, 5]
    assert _steps(tmp_path / "first.jsonl") + _steps(tmp_path / "resumed.jsonl") == _steps(
        tmp_path / "whole.jsonl"
    )
    resumed_bytes = (tmp_path / "resumed.safetensors").read_bytes()
    assert resumed_bytes == (tmp_path / "whole.safetensors").read_bytes()
    assert resumed_bytes != (tmp_path / "first.safetensors").read_bytes()


def _outputs(folder: Path, name: str) -> list[str]:
    return ["--out", str(folder / f"{name}.safetensors"), "--log", str(folder / f"{name}.jsonl")]


def _steps(log: Path) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = [json.loads(line) for line in log.read_text().splitlines()]
    return steps


def test_redirected_output_gets_no_progress_bar_codes(capsys: pytest.CaptureFixture[str]) -> None:
    """A progress bar into a file or pipe would be ANSI colour codes and carriage returns."""
    trainer = Trainer(TrainConfig(nodes=1, per_node=2, micro_batch=4, max_steps=2, eval_every=0))
    trainer.run(progress=True)
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\r" not in out and "\b" not in out
