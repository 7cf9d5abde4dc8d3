"""The environment TensorFlow reads once, when it is first imported.

Import this module before ``import tensorflow`` (or ``keras``), at the top of every module that
uses TensorFlow: ``from models import tf_env  # noqa: F401  isort: skip``. It imports nothing of
the project, so any module may import it first without closing an import circle
(``tests/architecture`` checks both the order and the leaf).
"""

from __future__ import annotations

import logging
import os
import sys

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
    the variable once), and never over an operator's own setting."""
    if _OPERATOR_LEVEL is None and sys.modules.get("tensorflow") is None:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"


if IMPORTED_TOO_EARLY:
    logging.getLogger("models.tf").warning(
        "tensorflow was imported before models.tf_env without "
        "TF_OVERRIDE_GLOBAL_THREADPOOL=1: per-session intra-op threads may be ignored"
    )
