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
# TensorFlow's C++ side logs several INFO/WARNING lines per session (CPU features, XLA, ...).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

if IMPORTED_TOO_EARLY:
    logging.getLogger("models.tf").warning(
        "tensorflow was imported before models.tf_env without "
        "TF_OVERRIDE_GLOBAL_THREADPOOL=1: per-session intra-op threads may be ignored"
    )
