"""The custom training step: qwZ forward/backward, W simulated workers, qgZ, SimiGrad.

One step, for a global batch ``B = W b`` (``b``: per-worker micro-batch):

1. the master kernels are quantized once with qwZ (as ZeRO++ all-gathers them once per step)
   and every worker computes the forward and backward pass of its ``b`` samples with them
   (one gradient tape per worker, inside one ``tf.function``); the gradient with respect to a
   dequantized kernel is the straight-through gradient of its master kernel;
2. SimiGrad's signal: the cosine of the two worker halves' mean gradients (fp32, before qgZ);
3. the workers' gradients are averaged: through qgZ's int4 two hops for kernels, in float32 for
   biases (and for everything when qgZ is off);
4. the Keras optimizer applies the average to the fp32 master weights, at the learning rate
   ``lr * sqrt(B / B0)`` when SimiGrad scales it;
5. SimiGrad moves ``b`` by its +/-10% rule.

Every step is logged (batch, similarity, learning rate, loss). The model the step's forward
pass computed with (its codes and scales, its biases) is kept: that is what ``export`` writes.
The whole state (master weights, optimizer slots, sampler, SimiGrad, qgZ residuals, logs) is
saved to a folder and restored bit for bit, so a resumed run ends where an uninterrupted one
does.
"""

from __future__ import annotations

# Sets the environment TensorFlow reads when it is first imported (thread pools, log level).
from models import tf_env  # noqa: F401  isort: skip

import json
import math
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import keras
import numpy as np
import tensorflow as tf

from models.checkpoint import QuantizedTensor
from models.train.data import DIGITS_CNN, Digits, EpochSampler, load_digits_split
from models.train.network import ZooNetwork, forward_logits
from models.train.qgz import TwoHopAverager
from models.train.qwz import QwZConfig, quantize_zoo_kernel, zoo_layout
from models.train.simigrad import SimiGradConfig, SimiGradController, half_similarity, scaled_lr
from models.train.traffic import Layout, StepTraffic, TensorInfo, zero3_traffic, zeropp_traffic
from models.zoo import ModelSpec, Params, Weights, init_weights
from models.zoo_checkpoint import to_input_major, to_output_major

STATE_FILE = "state.json"
TENSORS_FILE = "tensors.npz"


@dataclass(frozen=True, slots=True)
class TrainConfig:
    """One training run. Defaults: digits, 2 nodes x 4 workers, qwZ int8, qgZ on."""

    bits: int | None = 8
    """qwZ code width (8, 6, 4, 3, 2); None trains in fp32 without qwZ."""
    block_size: int = 32
    """qwZ block size along each kernel's input dimension (also the checkpoint's)."""
    nodes: int = 2
    """Simulated nodes."""
    per_node: int = 4
    """Simulated workers per node."""
    qgz: bool = True
    """Average kernel gradients through qgZ's int4 two-hop scheme (else in float32)."""
    error_feedback: bool = False
    """Carry qgZ's quantization error into the next step."""
    micro_batch: int = 8
    """Per-worker batch at the start (fixed unless SimiGrad is on)."""
    simigrad: SimiGradConfig | None = None
    """Adaptive batch size; None keeps the batch fixed."""
    epochs: float = 30.0
    """Training budget in passes over the training split (samples, whatever the batch)."""
    max_steps: int | None = None
    """Stop after this many optimizer steps even if the sample budget is not spent."""
    lr: float = 2e-3
    """Learning rate at the starting batch."""
    optimizer: Literal["adam", "sgd"] = "adam"
    seed: int = 0
    """Initial weights and data order."""
    eval_every: int = 5
    """Validation accuracy every this many steps (0: never during training)."""

    def __post_init__(self) -> None:
        if self.bits is not None:
            QwZConfig(self.bits, self.block_size)  # validates both
        if self.nodes < 1 or self.per_node < 1 or self.micro_batch < 1:
            raise ValueError("nodes, per_node and micro_batch must be at least 1")
        if self.simigrad is not None and self.world % 2:
            raise ValueError(f"SimiGrad needs an even number of workers, got {self.world}")

    @property
    def world(self) -> int:
        return self.nodes * self.per_node

    @property
    def qwz(self) -> QwZConfig | None:
        return None if self.bits is None else QwZConfig(self.bits, self.block_size)

    def to_doc(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> TrainConfig:
        simi = doc.get("simigrad")
        return cls(**{**doc, "simigrad": None if simi is None else SimiGradConfig(**simi)})


@dataclass(frozen=True, slots=True)
class StepLog:
    step: int
    batch: int
    similarity: float
    lr: float
    loss: float
    samples: int


@dataclass(frozen=True, slots=True)
class EvalLog:
    step: int
    samples: int
    val_accuracy: float


@dataclass(slots=True)
class History:
    steps: list[StepLog] = field(default_factory=list)
    evals: list[EvalLog] = field(default_factory=list)

    def steps_to(self, accuracy: float) -> int | None:
        """Optimizer steps until validation accuracy first reached ``accuracy``."""
        return next((e.step for e in self.evals if e.val_accuracy >= accuracy), None)

    def mean_batch(self) -> float:
        return float(np.mean([s.batch for s in self.steps])) if self.steps else 0.0


class Trainer:
    """Trains ``spec`` on ``data`` (default: the digits CNN on the digits split)."""

    def __init__(
        self, config: TrainConfig, spec: ModelSpec = DIGITS_CNN, data: Digits | None = None
    ) -> None:
        self.config = config
        self.spec = spec
        self.data = load_digits_split() if data is None else data
        keras.utils.set_random_seed(config.seed)
        self.network = ZooNetwork(spec, init_weights(replace(spec, seed=config.seed)))
        self.optimizer = self._make_optimizer()
        self.optimizer.build(self.network.parameters)
        self.sampler = EpochSampler(len(self.data.train), config.seed)
        self.micro_batch = config.micro_batch
        self.simigrad = (
            None
            if config.simigrad is None
            else SimiGradController(config.simigrad, config.micro_batch)
        )
        self.averagers = [
            TwoHopAverager(
                to_output_major(self.network.layer_of(i), k.numpy()).shape,
                config.nodes,
                config.per_node,
                config.error_feedback,
            )
            for i, k in enumerate(self.network.kernels)
        ]
        self.step = 0
        self.samples = 0
        self.history = History()
        self.forward_params: list[np.ndarray] | None = None  # master weights the last step used
        self.forward_codes: dict[int, QuantizedTensor] = {}  # codes that forward computed
        self._worker_grads = self._build_worker_grads()
        params = self.network.parameters
        self._apply = tf.function(
            lambda grads: self.optimizer.apply_gradients(zip(grads, params, strict=True))
        )

    def _make_optimizer(self) -> keras.optimizers.Optimizer:
        if self.config.optimizer == "sgd":
            return keras.optimizers.SGD(learning_rate=self.config.lr, momentum=0.9)
        return keras.optimizers.Adam(learning_rate=self.config.lr)

    # -- the step ------------------------------------------------------------------------------

    def _build_worker_grads(self) -> Callable[..., Any]:
        net, world = self.network, self.config.world
        image_shape = self.spec.inputs[0].shape
        kernel_specs = [tf.TensorSpec(k.shape, tf.float32) for k in net.kernels]

        @tf.function(
            input_signature=[
                tf.TensorSpec([world, None, *image_shape], tf.float32),
                tf.TensorSpec([world, None], tf.int32),
                kernel_specs,
            ],
            autograph=False,
        )
        def worker_grads(
            x: tf.Tensor, y: tf.Tensor, kernels: list[tf.Tensor]
        ) -> tuple[list[tf.Tensor], tf.Tensor]:
            biases = [tf.convert_to_tensor(b) for b in net.biases]
            used = [t for pair in zip(kernels, biases, strict=True) for t in pair]
            per_worker: list[list[tf.Tensor]] = []
            losses = []
            for w in range(world):  # one simulated worker: its own forward and backward pass
                with tf.GradientTape() as tape:
                    tape.watch(used)
                    logits = net.logits(x[w], used[0::2], used[1::2])
                    loss = tf.reduce_mean(
                        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y[w], logits=logits)
                    )
                per_worker.append(tape.gradient(loss, used))
                losses.append(loss)
            stacked = [tf.stack([g[p] for g in per_worker]) for p in range(len(used))]
            return stacked, tf.stack(losses)

        return worker_grads

    def _forward_kernels(self, kernels: list[np.ndarray]) -> list[np.ndarray]:
        """The kernels this step's forward pass computes with: through qwZ (recording the codes
        and scales) or the fp32 masters. Quantized once per step, as the qwZ all-gather hands
        every worker the same weights; the workers' gradients with respect to these are the
        straight-through gradients of the masters (``network.qwz_kernel`` is the same thing as
        one TensorFlow op, for a model used on its own)."""
        qwz = self.config.qwz
        if qwz is None:
            return kernels
        used = []
        for position, kernel in enumerate(kernels):
            layer = self.network.layer_of(position)
            quantized = quantize_zoo_kernel(layer, kernel, qwz)
            self.forward_codes[position] = quantized
            used.append(zoo_layout(layer, quantized))
        return used

    def train_step(self) -> StepLog:
        cfg, world, b = self.config, self.config.world, self.micro_batch
        batch = world * b
        index = self.sampler.next_indices(batch)
        x = self.data.train.x[index].reshape(world, b, *self.data.train.x.shape[1:])
        y = self.data.train.y[index].reshape(world, b)
        before = [np.array(v.numpy()) for v in self.network.parameters]
        kernels = self._forward_kernels(before[0::2])
        grads_t, losses = self._worker_grads(
            tf.constant(x), tf.constant(y), [tf.constant(k) for k in kernels]
        )
        grads = [g.numpy() for g in grads_t]
        similarity = half_similarity(grads) if world >= 2 and world % 2 == 0 else float("nan")
        averaged = self._average(grads)
        lr = cfg.lr
        if self.simigrad is not None and self.simigrad.config.scale_lr:
            lr = scaled_lr(cfg.lr, batch, world * cfg.micro_batch)
        self.optimizer.learning_rate.assign(lr)
        self._apply([tf.constant(g) for g in averaged])
        self.forward_params = before
        self.step += 1
        self.samples += batch
        log = StepLog(self.step, batch, similarity, lr, float(np.mean(losses)), self.samples)
        self.history.steps.append(log)
        if self.simigrad is not None:
            self.micro_batch = self.simigrad.observe(similarity)
        if cfg.eval_every and self.step % cfg.eval_every == 0:
            acc = self.accuracy(self.current_weights(), "val")
            self.history.evals.append(EvalLog(self.step, self.samples, acc))
        return log

    def _average(self, grads: list[np.ndarray]) -> list[np.ndarray]:
        out = []
        for p, g in enumerate(grads):
            if p % 2 == 0 and self.config.qgz:
                layer = self.network.layer_of(p // 2)
                rows = np.stack([to_output_major(layer, gw) for gw in g])
                out.append(to_input_major(layer, self.averagers[p // 2].average(rows)))
            else:
                out.append(g.mean(axis=0, dtype=np.float32))
        return out

    # -- the run -------------------------------------------------------------------------------

    @property
    def sample_budget(self) -> int:
        return math.ceil(self.config.epochs * len(self.data.train))

    def finished(self) -> bool:
        if self.config.max_steps is not None and self.step >= self.config.max_steps:
            return True
        return self.samples >= self.sample_budget

    def run(
        self,
        *,
        progress: bool = True,
        log_path: Path | None = None,
        stop_after: int | None = None,
    ) -> History:
        """Train until the budget is spent (or ``stop_after`` more steps); ``log_path`` gets
        one JSON line per step."""
        # Keras's bar writes ANSI colour codes and carriage returns whatever stdout is: only on a
        # terminal, never into redirected output.
        bar = (
            keras.utils.Progbar(
                self.sample_budget, unit_name="sample", stateful_metrics=["batch", "lr", "cos"]
            )
            if progress and sys.stdout.isatty()
            else None
        )
        log_file = log_path.open("a", encoding="utf-8") if log_path else None
        done = 0
        try:
            while not self.finished() and (stop_after is None or done < stop_after):
                log = self.train_step()
                done += 1
                if log_file is not None:
                    log_file.write(json.dumps(asdict(log)) + "\n")
                if bar is not None:
                    values = [("loss", log.loss), ("batch", log.batch), ("lr", log.lr)]
                    if not math.isnan(log.similarity):
                        values.append(("cos", log.similarity))
                    bar.update(min(self.samples, self.sample_budget), values=values)
        finally:
            if log_file is not None:
                log_file.close()
        if bar is not None:
            sys.stdout.write("\n")
        return self.history

    # -- what the model computes ---------------------------------------------------------------

    def current_weights(self) -> Weights:
        """The weights the next forward pass would compute with (kernels through qwZ)."""
        return self._served(self.network.master_weights(), {})

    def served_weights(self) -> Weights:
        """The weights the last training forward pass computed with: dequantized codes of that
        pass and the biases it used. Before any step: the current ones."""
        if self.forward_params is None:
            return self.current_weights()
        master: list[Params | None] = [None] * len(self.spec.layers)
        for position, index in enumerate(self.network.param_layers):
            master[index] = Params(
                self.forward_params[2 * position], self.forward_params[2 * position + 1]
            )
        return self._served(tuple(master), self.forward_codes)

    def served_codes(self) -> dict[int, QuantizedTensor]:
        """Per parameterised layer: the codes and scales of the last training forward pass
        (empty without qwZ)."""
        qwz = self.config.qwz
        if qwz is None:
            return {}
        if self.forward_params is None:
            sources = [k.numpy() for k in self.network.kernels]
        else:
            sources = self.forward_params[0::2]
        codes = {}
        for position, kernel in enumerate(sources):
            recorded = self.forward_codes.get(position)
            codes[position] = (
                recorded
                if recorded is not None
                else quantize_zoo_kernel(self.network.layer_of(position), kernel, qwz)
            )
        return codes

    def _served(self, master: Weights, recorded: dict[int, QuantizedTensor]) -> Weights:
        qwz = self.config.qwz
        out: list[Params | None] = list(master)
        if qwz is None:
            return tuple(out)
        for position, index in enumerate(self.network.param_layers):
            p = master[index]
            assert p is not None
            layer = self.spec.layers[index]
            quantized = recorded.get(position) or quantize_zoo_kernel(layer, p.kernel, qwz)
            out[index] = Params(zoo_layout(layer, quantized), p.bias)
        return tuple(out)

    def accuracy(self, weights: Weights, split: Literal["train", "val", "test"]) -> float:
        part = getattr(self.data, split)
        logits = forward_logits(self.spec, weights, part.x)
        return float(np.mean(np.argmax(logits, axis=1) == part.y))

    def traffic(self) -> tuple[StepTraffic, StepTraffic]:
        """Bytes per step of ZeRO-3 and of ZeRO++ for this model and layout (qwZ at the
        configured width; int8 when training in fp32)."""
        tensors = []
        for position, index in enumerate(self.network.param_layers):
            layer = self.spec.layers[index]
            kernel = to_output_major(layer, self.network.kernels[position].numpy())
            tensors.append(TensorInfo(f"layers.{index}.weight", kernel.shape, True))
            bias_shape = tuple(self.network.biases[position].shape)
            tensors.append(TensorInfo(f"layers.{index}.bias", bias_shape, False))
        layout = Layout(self.config.nodes, self.config.per_node)
        bits = 8 if self.config.bits is None else self.config.bits
        return (
            zero3_traffic(tensors, layout),
            zeropp_traffic(tensors, layout, bits, self.config.block_size),
        )

    # -- resumable state -----------------------------------------------------------------------

    def save_state(self, directory: Path) -> Path:
        """Write the whole training state to ``directory`` (replaced atomically file by file)."""
        directory.mkdir(parents=True, exist_ok=True)
        arrays: dict[str, Any] = {}  # (np.savez's keywords)
        for i, v in enumerate(self.network.parameters):
            arrays[f"param.{i}"] = v.numpy()
        for i, v in enumerate(self.optimizer.variables):
            arrays[f"optimizer.{i}"] = np.asarray(v.numpy())
        for i, avg in enumerate(self.averagers):
            arrays[f"qgz.{i}.worker"] = avg.worker_residual
            arrays[f"qgz.{i}.node"] = avg.node_residual
        if self.forward_params is not None:
            for i, a in enumerate(self.forward_params):
                arrays[f"forward.{i}"] = a
        doc = {
            "config": self.config.to_doc(),
            "spec": self.spec.name,
            "step": self.step,
            "samples": self.samples,
            "micro_batch": self.micro_batch,
            "simigrad_recent": [] if self.simigrad is None else list(self.simigrad.recent),
            "sampler": self.sampler.state(),
            "history": {
                "steps": [asdict(s) for s in self.history.steps],
                "evals": [asdict(e) for e in self.history.evals],
            },
        }
        _atomic_write(directory / TENSORS_FILE, lambda f: np.savez(f, **arrays))
        _atomic_write(directory / STATE_FILE, lambda f: f.write(json.dumps(doc).encode()))
        return directory

    @classmethod
    def resume(cls, directory: Path, spec: ModelSpec = DIGITS_CNN, **overrides: Any) -> Trainer:
        """A trainer in exactly the saved state; ``overrides`` may change budget fields
        (``epochs``, ``max_steps``) of the saved configuration."""
        doc = json.loads((directory / STATE_FILE).read_text())
        if doc["spec"] != spec.name:
            raise ValueError(f"{directory} holds a {doc['spec']!r} run, not {spec.name!r}")
        config = replace(TrainConfig.from_doc(doc["config"]), **overrides)
        trainer = cls(config, spec)
        with np.load(directory / TENSORS_FILE) as arrays:
            for i, v in enumerate(trainer.network.parameters):
                v.assign(arrays[f"param.{i}"])
            for i, v in enumerate(trainer.optimizer.variables):
                v.assign(arrays[f"optimizer.{i}"])
            for i, avg in enumerate(trainer.averagers):
                avg.worker_residual = arrays[f"qgz.{i}.worker"]
                avg.node_residual = arrays[f"qgz.{i}.node"]
            count = len(trainer.network.parameters)
            if "forward.0" in arrays:
                trainer.forward_params = [arrays[f"forward.{i}"] for i in range(count)]
        trainer.step = int(doc["step"])
        trainer.samples = int(doc["samples"])
        trainer.micro_batch = int(doc["micro_batch"])
        if trainer.simigrad is not None:
            trainer.simigrad.micro_batch = trainer.micro_batch
            trainer.simigrad.recent.extend(doc["simigrad_recent"])
        trainer.sampler.restore(doc["sampler"])
        trainer.history = History(
            [StepLog(**s) for s in doc["history"]["steps"]],
            [EvalLog(**e) for e in doc["history"]["evals"]],
        )
        return trainer


def _atomic_write(path: Path, write: Callable[[Any], Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("wb") as fh:
        write(fh)
    os.replace(tmp, path)
