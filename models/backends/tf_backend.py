"""TensorFlow backend: a SavedModel run in its own ``tf.compat.v1.Session`` and graph.

A version may instead be a block-quantized checkpoint (``format = "checkpoint"``): the graph is
then built from the checkpoint's architecture with int8 codes in variables, dequantized in the
graph (``models.quant_tf``).

A v1 session is the one TensorFlow API whose thread counts can be chosen per instance
(``ConfigProto``); ``tf.config.threading`` is process-wide and frozen after start-up, which would
make operation-level parallelism untunable at run time.
"""

from __future__ import annotations

# Sets the environment TensorFlow reads when it is first imported (thread pools, log level).
from models import tf_env  # noqa: F401  isort: skip

import contextlib
import ctypes
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from models.backends import checkpoint_errors, describe, plan_options
from models.backends.devices import Placement, tf_expected
from models.backends.loaded_runtime import LoadedRuntime
from models.backends.tf_config import session_config
from models.repository import ModelVersion
from models.runtime import (
    InferenceFailed,
    ModelLoadError,
    ModelMetadata,
    TensorSpec,
    Threads,
)
from models.serving_plan import ServingPlan

PLATFORM = "tensorflow_savedmodel"
SIGNATURE = "serving_default"
TAGS = ["serve"]
log = logging.getLogger("models.tf")


class _DropLoaderDeprecation(logging.Filter):
    """The v1 loader is deprecated in favour of tf.saved_model.load, which only runs eagerly
    under the process-wide thread pools; we use it on purpose, so its notice is noise."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "loader_impl) is deprecated" not in record.getMessage()


tf.get_logger().addFilter(_DropLoaderDeprecation())

_placement: Placement | None = None


def expected_placement() -> Placement:
    """Where this process's sessions place their ops, and why. TensorFlow lists its GPUs once
    (initialising CUDA), so the answer is computed once."""
    global _placement
    if _placement is None:
        _placement = tf_expected(
            tf.config.list_physical_devices("GPU"), built_with_cuda=tf.test.is_built_with_cuda()
        )
    return _placement


def install_info() -> dict[str, Any]:
    """This TensorFlow as ``iotgw doctor`` reports it: version, CUDA build, devices."""
    return {
        "version": tf.__version__,
        "built_with_cuda": bool(tf.test.is_built_with_cuda()),
        "devices": [d.name for d in tf.config.list_physical_devices()],
    }


@dataclass(frozen=True, slots=True)
class _Signature:
    """The graph's serving interface: specs in TF's (sorted) order and their tensors."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    feeds: list[tf.Tensor]
    fetches: list[tf.Tensor]


class TfRuntime(LoadedRuntime):
    """A loaded SavedModel or checkpoint; satisfies ``models.runtime.Runtime``."""

    def __init__(self, version: ModelVersion, threads: Threads) -> None:
        self._what = describe(version)
        path = version.model_path
        checkpoint = version.config.format == "checkpoint"
        if checkpoint:
            if not path.is_file():
                raise ModelLoadError(f"{self._what}: checkpoint {path} does not exist")
        elif not (path / "saved_model.pb").is_file() and not (path / "saved_model.pbtxt").is_file():
            raise ModelLoadError(f"{self._what}: no SavedModel at {path} (saved_model.pb missing)")
        self._threads = threads
        self._placement = expected_placement()
        graph = tf.Graph()
        try:
            session = tf.compat.v1.Session(graph=graph, config=session_config(threads))
        except Exception as exc:  # e.g. a GPU that cannot be initialised
            raise ModelLoadError(
                f"{self._what}: cannot create a TensorFlow session: {exc}"
            ) from exc
        try:
            with graph.as_default():
                plan: ServingPlan | None = None
                if checkpoint:
                    sig, plan = _build_checkpoint(version, session)
                else:
                    sig = _load_savedmodel(session, str(path), self._what)
            # A callable skips the per-call fetch/feed analysis of Session.run.
            self._call = session.make_callable(sig.fetches, feed_list=sig.feeds)
        except ModelLoadError:
            session.close()
            raise
        except Exception as exc:
            session.close()
            what = "checkpoint" if checkpoint else "SavedModel"
            raise ModelLoadError(
                f"{self._what}: TensorFlow cannot load {what} {path}: {exc}"
            ) from exc
        graph.finalize()  # nothing may add ops later; catches accidental graph growth per call
        self._session: tf.compat.v1.Session | None = session
        self._metadata = ModelMetadata(
            name=version.name,
            version=str(version.version),
            platform=PLATFORM,
            inputs=sig.inputs,
            outputs=sig.outputs,
            serving_plan=plan,
        )
        self._input_names = [s.name for s in sig.inputs]
        self._output_names = [s.name for s in sig.outputs]
        self._announce(log)

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._session is None:
            raise InferenceFailed(f"{self._what}: runtime is closed")
        missing = [n for n in self._input_names if n not in inputs]
        if missing:
            raise InferenceFailed(f"{self._what}: missing inputs {', '.join(missing)}")
        try:
            results = self._call(*(inputs[n] for n in self._input_names))
        except Exception as exc:
            raise InferenceFailed(f"{self._what}: inference failed: {exc}") from exc
        return dict(zip(self._output_names, results, strict=True))

    def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            session.close()


def _specs(infos: Mapping[str, Any], what: str) -> tuple[TensorSpec, ...]:
    """Signature entries (sorted by key, as TF itself orders them) as TensorSpecs."""
    specs = []
    for key in sorted(infos):
        info = infos[key]
        if info.tensor_shape.unknown_rank:
            raise ModelLoadError(f"{what}: signature tensor {key!r} has unknown rank")
        dtype = tf.dtypes.as_dtype(info.dtype)
        # tf.string has numpy dtype object (elements are bytes), as in the Runtime contract.
        np_dtype = "object" if dtype == tf.string else np.dtype(dtype.as_numpy_dtype).name
        shape = tuple(d.size if d.size >= 0 else -1 for d in info.tensor_shape.dim)
        specs.append(TensorSpec(key, np_dtype, shape))
    return tuple(specs)


def _load_savedmodel(session: tf.compat.v1.Session, path: str, what: str) -> _Signature:
    graph = session.graph
    meta = tf.compat.v1.saved_model.loader.load(session, TAGS, path)
    signature = meta.signature_def.get(SIGNATURE)
    if signature is None:
        raise ModelLoadError(
            f"{what}: SavedModel {path} has no {SIGNATURE!r} signature "
            f"(has: {', '.join(sorted(meta.signature_def)) or 'none'})"
        )
    inputs = _specs(signature.inputs, what)
    outputs = _specs(signature.outputs, what)
    feeds = [graph.get_tensor_by_name(signature.inputs[s.name].name) for s in inputs]
    fetches = [graph.get_tensor_by_name(signature.outputs[s.name].name) for s in outputs]
    return _Signature(inputs, outputs, feeds, fetches)


def _build_checkpoint(
    version: ModelVersion, session: tf.compat.v1.Session
) -> tuple[_Signature, ServingPlan | None]:
    """Build the checkpoint's graph in the session's graph and fill its variables."""
    # Deferred: only checkpoint versions need the reader and the builder.
    from models.checkpoint import load_checkpoint
    from models.checkpoint_graphs import tf_graph

    with checkpoint_errors(version):
        checkpoint = load_checkpoint(version.model_path)
        spec, built, plan = tf_graph(checkpoint, version.model_path, plan_options(version))
    del checkpoint  # its arrays now only live in the feed below
    _return_freed_heap()
    session.run(built.init_op, feed_dict=built.init_feed)
    built.init_feed.clear()  # the variables hold their own copies now
    names = sorted(built.inputs)  # TF's signature order, as for SavedModels
    shapes = {i.name: i.shape for i in spec.inputs}
    inputs = tuple(TensorSpec(n, "float32", (-1, *shapes[n])) for n in names)
    outputs = (TensorSpec(spec.output, "float32", (-1, *spec.output_shape)),)
    signature = _Signature(inputs, outputs, [built.inputs[n] for n in names], [built.output])
    return signature, plan


def _return_freed_heap() -> None:
    """Hand the heap pages that reading the checkpoint used and freed (the file's buffer, its
    arrays, the codes before they were laid out for the graph) back to the system before the
    session fills its variables and builds its executors.

    glibc keeps freed heap pages; what TensorFlow allocates next (its allocator's regions,
    executors, kernels) is carved out of them, and a page that is partly used again, or was
    touched before a region took it over, stays resident for good. Measured on a 25M-weight MLP
    held as int4 codes in the graph (12.6 MB of codes): 45 MB held after loading and three
    runs without this, 33-35 MB with it. No ``gc.collect()``: the freed arrays hold no cycles,
    and a collection would hold the interpreter lock for as long as the process has objects to
    scan. A no-op where libc has no ``malloc_trim``."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def load(version: ModelVersion, threads: Threads) -> TfRuntime:
    return TfRuntime(version, threads)
