"""The GPU benchmark: ``bench http`` and ``bench quant`` on CUDA against the same on the CPU of
the same machine, in one run (``iotgw bench gpu``; the GPU lane, ``./scripts/test.sh --gpu``,
runs ``--quick``).

Two sides, each in processes of its own with the same install (onnxruntime-gpu and TensorFlow
built with CUDA): **cuda**, as the gateway runs by default on a GPU machine, and **cpu**, the same
with the GPU hidden (``CUDA_VISIBLE_DEVICES=""``: ONNX Runtime's CUDA provider cannot initialise
and falls back to its CPU provider, TensorFlow sees no GPU), which is also how an operator keeps
a gateway off the GPU. Per side:

1. **Where the models run**: ``iotgw doctor --json --load`` on a repository of an ONNX model
   and a TensorFlow checkpoint; every model must be on ``cuda:0`` on the cuda side and on
   ``cpu`` on the other, or the run stops there (a comparison of two CPU runs would say
   nothing).
2. ``python -m benchmarks.http`` and ``python -m benchmarks.quant`` (``--quick`` passed on),
   their results files written under the run's working folder and read back.

Summary (cuda / cpu ratios: above 1 the GPU is faster for a throughput, below 1 for a latency):
``cnn_gateway_throughput_cuda_vs_cpu`` (vision_cnn through the gateway at saturation),
``cnn_limit_throughput_cuda_vs_cpu`` (the same runtime in-process, no gateway),
``gateway_p50_ms_cuda_vs_cpu`` (sensor_mlp at low load), ``fc_fp32_batch1_latency_cuda_vs_cpu``
and ``fc_int4_batch1_latency_cuda_vs_cpu`` (the quant benchmark's fully connected model on ONNX
Runtime), and each side's own headline figures with a ``_cuda`` / ``_cpu`` suffix. The quant
benchmark's weight memory is the process's resident memory: on CUDA the weights sit in the
GPU's memory instead, so its memory ratios say nothing on that side and are left out.

Results: ``benchmarks/results/gpu.json`` (``gpu.quick.json`` in quick mode, or under ``--out``).
Run with ``iotgw bench gpu [--quick] [--out DIR]`` or ``python -m benchmarks.gpu``; on a
machine without a GPU it stops after step 1 of the cuda side and says why.
"""

from benchmarks.gpu.run import main, run

__all__ = ["main", "run"]
