"""The serving plan of a zoo checkpoint on TensorFlow: each quantized layer timed alone, at each
planned batch size in a session of one intra-op thread, both ways it can run
(``models.serving_plan``).

Ways: ``graph`` (the codes in variables, unpacked and scaled by the graph on every run,
``models.quant_tf``) and ``load`` (a float32 variable). TensorFlow has no kernel that reads
packed codes. Bytes held: ``load`` 4 per weight; ``graph`` the codes (two per byte up to 4 bits,
else one), the scales, and the float chunk TensorFlow keeps from the last run.
"""

from __future__ import annotations

# Sets the environment TensorFlow reads when it is first imported (thread pools, log level).
from models import tf_env  # noqa: F401  isort: skip

import math
from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf

from models.backends.devices import tf_expected
from models.backends.tf_config import session_config
from models.plan_zoo import Bind, PlanRuntime, QuantLayer, code_bytes, plan_zoo, scale_bytes
from models.quant_tf import CHUNK_ELEMENTS, NIBBLE_BITS, build_graph
from models.runtime import Threads
from models.serving_plan import CostCache, ServingPlan, Way
from models.zoo import Dense, Flatten, Input, ModelSpec
from models.zoo_checkpoint import LayerParams

RUNTIME = "tensorflow"


def ways(q: QuantLayer) -> dict[Way, int]:
    data = q.params.kernel.data
    bits_held = 4 if data.bits <= NIBBLE_BITS else 8
    # TensorFlow keeps about one float copy of a dequantized chunk after a run (measured:
    # docs/performance.md, "Measurements behind the backend settings"), so the graph way holds
    # that too.
    padded = data.codes.shape[0] * data.blocks_per_row * data.block_size
    transient = 4 * min(CHUNK_ELEMENTS, padded)
    return {
        "graph": code_bytes(data, bits_held) + scale_bytes(data) + transient,
        "load": 4 * math.prod(q.params.kernel.shape),
    }


def build(q: QuantLayer, p: LayerParams, way: Way) -> Bind:
    """The layer alone, ``way``, in a session of its own (closed when the calls are dropped): a
    call on any input."""
    # A convolution is followed by a Flatten (a reshape: no copy), as a model must end in a vector.
    layers = (q.layer,) if isinstance(q.layer, Dense) else (q.layer, Flatten())
    spec = ModelSpec("layer", (Input("x", q.in_shape),), layers, "y", softmax=False)
    graph = tf.Graph()
    with graph.as_default():
        built = build_graph(spec, [p, None][: len(layers)])
    session = tf.compat.v1.Session(graph=graph, config=session_config(Threads(1, 1)))
    session.run(built.init_op, feed_dict=built.init_feed)
    call = session.make_callable(built.output, feed_list=[built.inputs["x"]])

    def bind(x: np.ndarray) -> Callable[[], object]:
        return lambda: call(x)

    return bind


def tf_plan(
    spec: ModelSpec, params: Sequence[LayerParams], *, budget: float, cache: CostCache
) -> ServingPlan:
    # Its sessions place ops as the serving sessions do (the GPU when TensorFlow sees one), so
    # the device is part of every cost's key: CPU figures never answer for the GPU.
    gpus = tf.config.list_physical_devices("GPU")
    device = tf_expected(gpus, built_with_cuda=tf.test.is_built_with_cuda()).device
    runtime = PlanRuntime(RUNTIME, tf.__version__, ways, build, {"device": device})
    return plan_zoo(runtime, spec, params, budget=budget, cache=cache)
