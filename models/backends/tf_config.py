"""The TensorFlow session configuration every session here is opened with: the gateway's
runtime instances and the serving plan's measurements (``models.plan_tf``) alike.

A leaf beside the backend, so the plan can open sessions like the backend's without importing
the backend (which imports the plan).
"""

from __future__ import annotations

# Sets the environment TensorFlow reads when it is first imported (thread pools, log level).
from models import tf_env  # noqa: F401  isort: skip

import tensorflow as tf

from models.runtime import Threads


def session_config(threads: Threads) -> tf.compat.v1.ConfigProto:
    config = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=threads.intra_op,
        inter_op_parallelism_threads=threads.inter_op,
        use_per_session_threads=True,
        allow_soft_placement=True,
    )
    # Several runtime instances share one GPU; growing on demand keeps the first from reserving
    # all of its memory.
    config.gpu_options.allow_growth = True
    return config
