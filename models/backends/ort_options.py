"""ONNX Runtime session options as every session here is opened: the gateway's runtime
instances and the serving plan's measurements (``models.plan_onnx``) alike.

A leaf beside the backend, so the plan can open sessions like the backend's without importing
the backend (which imports the plan).
"""

from __future__ import annotations

import onnxruntime as ort

from models.runtime import Threads


def session_options(threads: Threads, *, checkpoint: bool = False) -> ort.SessionOptions:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads.intra_op
    opts.inter_op_num_threads = threads.inter_op
    # The inter-op pool only exists in parallel mode; sequential mode avoids its overhead when
    # there is a single inter-op thread anyway.
    opts.execution_mode = (
        ort.ExecutionMode.ORT_PARALLEL if threads.inter_op > 1 else ort.ExecutionMode.ORT_SEQUENTIAL
    )
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # No busy-waiting between batches. By default ORT's pool threads spin after each parallel
    # section, which only pays off when nothing else wants the cores: spinning slowed batch-1
    # latency and the thread beside it (docs/performance.md, "Measurements behind the backend
    # settings"). A lone session on idle cores does gain a little, but the gateway always has its
    # event loop and usually more than one instance. With 1 thread there is no pool and the
    # setting has no effect.
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
    if checkpoint:
        # No memory arena: a checkpoint's graph dequantizes convolution kernels on every run,
        # and the arena would keep the largest such transient float copy for the session's
        # lifetime, undoing what quantization saved, at no cost in latency (docs/performance.md,
        # "Measurements behind the backend settings").
        opts.enable_cpu_mem_arena = False
    return opts
