"""The environment TensorFlow reads once, when it is first imported.

Import this module before ``import tensorflow`` (or ``keras``), at the top of every module that
uses TensorFlow: ``from models import tf_env  # noqa: F401  isort: skip``. It imports nothing of
the project, so any module may import it first without closing an import circle
(``tests/architecture`` checks both the order and the leaf).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import re
import sys
import tempfile
import types
from collections.abc import Iterator, Sequence

# Whether someone imported TensorFlow before us without the variable below: too late to fix.
IMPORTED_TOO_EARLY = (
    sys.modules.get("tensorflow") is not None
    and os.environ.get("TF_OVERRIDE_GLOBAL_THREADPOOL") != "1"
)
# Without TF_OVERRIDE_GLOBAL_THREADPOOL=1, TensorFlow runs every session's ops on one process-wide
# intra-op pool sized at first use, silently ignoring each session's
# intra_op_parallelism_threads. TensorFlow reads it when it is first imported, so it must be set
# before that import (setdefault: an operator's explicit choice wins).
os.environ.setdefault("TF_OVERRIDE_GLOBAL_THREADPOOL", "1")
# On a GPU, TensorFlow reserves nearly all of the device's memory the first time anything runs
# there, unless a session asked it to grow (models.backends.tf_config does, but an eager call,
# such as exporting a SavedModel, comes first in some processes): ONNX Runtime's CUDA sessions in
# the same process, and other gateway processes on the same GPU, would then find none left.
os.environ.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
# TensorFlow's C++ side logs several INFO/WARNING lines per session (CPU features, XLA, ...).
# An operator's own TF_CPP_MIN_LOG_LEVEL is kept, whatever the gateway's log level.
_OPERATOR_LEVEL = os.environ.get("TF_CPP_MIN_LOG_LEVEL")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def quiet_native_logs() -> None:
    """Silence TensorFlow's C++ logging below FATAL (TF_CPP_MIN_LOG_LEVEL=3) for a process whose
    own log shows warnings and errors only, and for ``iotgw doctor``: the lines TensorFlow and
    XLA print at import (absl's "All log messages before absl::InitializeLog()" banner, CUDA
    factories registered twice, CPU features, oneDNN) are ERROR and INFO lines of no use there;
    a failing op still raises in Python. Effective only before TensorFlow is imported (it reads
    the variable once), and never over an operator's own setting.

    TensorFlow 2.21 prints some of them through absl whatever the variable says (the oneDNN
    line, on CPUs where oneDNN's custom operations are on: AVX-512 VNNI here), so the first
    ``import tensorflow`` also runs with the process's stderr (file descriptor 2) captured, and
    what it wrote is written back without the lines the level in force hides (``_QuietImport``;
    an operator's own level is the one in force)."""
    if sys.modules.get("tensorflow") is not None:
        return
    if _OPERATOR_LEVEL is None:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    filter_native_import_lines()


def filter_native_import_lines() -> None:
    """Run the first ``import tensorflow`` with its stderr filtered by the TF_CPP_MIN_LOG_LEVEL
    in force, without changing it (at the gateway's INFO: 2, so absl's banner and the oneDNN
    INFO line, which TensorFlow 2.21 prints whatever the level says, are left out too)."""
    if sys.modules.get("tensorflow") is not None:
        return
    try:
        level = int(os.environ["TF_CPP_MIN_LOG_LEVEL"])
    except ValueError:
        level = 0
    hidden = "IWE"[: max(0, min(level, 3))]
    if hidden and not any(isinstance(f, _QuietImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _QuietImport(hidden))


def _native_noise(hidden: str) -> re.Pattern[bytes]:
    """absl's banner, and glog-style lines of the ``hidden`` severities ("I0000 00:00:1796.123
    31795 port.cc:153] ..." is INFO)."""
    return re.compile(
        rb"^(WARNING: All log messages before absl::InitializeLog\(\) is called are written "
        rb"to STDERR|[" + hidden.encode() + rb"]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [\w./-]+:\d+\] "
        rb".*)\r?\n?$"
    )


@contextlib.contextmanager
def _stderr_without(noise: re.Pattern[bytes]) -> Iterator[None]:
    """File descriptor 2 goes to a temporary file for the block, and what was written there,
    the lines ``noise`` matches left out, goes on to the real stderr after it: the rest of the
    process's output (another thread's log line) is delayed, not lost."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            lines = capture.read().splitlines(keepends=True)
            kept = [line for line in lines if not noise.match(line)]
            if kept:
                os.write(2, b"".join(kept))


class _QuietLoader(importlib.abc.Loader):
    """The ``tensorflow`` package's own loader, its module run with stderr filtered; once it
    ran, the finder leaves ``sys.meta_path``."""

    def __init__(self, loader: importlib.abc.Loader, hidden: str) -> None:
        self._loader, self._noise = loader, _native_noise(hidden)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        try:
            with _stderr_without(self._noise):
                self._loader.exec_module(module)
        finally:
            sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _QuietImport)]


class _QuietImport(importlib.abc.MetaPathFinder):
    """Finds nothing of its own: hands ``import tensorflow`` the package's usual spec (from the
    path finder; an availability check such as ``importlib.util.find_spec`` gets it too) with
    its loader wrapped (``_QuietLoader``), hiding the ``hidden`` severities (letters of IWE)."""

    def __init__(self, hidden: str) -> None:
        self._hidden = hidden

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "tensorflow":
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietLoader(spec.loader, self._hidden)
        return spec


if IMPORTED_TOO_EARLY:
    logging.getLogger("models.tf").warning(
        "tensorflow was imported before models.tf_env without "
        "TF_OVERRIDE_GLOBAL_THREADPOOL=1: per-session intra-op threads may be ignored"
    )
