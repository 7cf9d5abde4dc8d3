"""Quantized checkpoints against fp32 on both runtimes (``iotgw bench quant``).

For a model with large fully connected layers (``fc_large``: 1024 -> 4096 -> 4096 -> 1024 -> 10,
25M weights) and for the demo CNN (``vision_cnn``), side by side in one run, the same weights as
an fp32, an int8 and an int4 checkpoint (qwZ blocks of 128 along each kernel's input), each
served by ONNX Runtime (MatMulNBits with ``accuracy_level=4`` for fully connected layers,
blocked DequantizeLinear for convolutions) and by TensorFlow (codes dequantized in the graph:
two per byte at 4 bits, one at 8). The fp32 baseline goes through the same checkpoint path with
float tensors, so the graphs differ only in how the weights are held.

- **Latency** at batch 1, 8 and 32, one intra-op thread: per round, every configuration in
  turn, the median of back-to-back calls; 5 rounds (median, min, max). The int/fp32 ratio is
  taken per round, so both sides of a ratio saw the same moment of a shared machine.
- **Weight memory in the process**: each configuration loaded in a fresh Python process that
  already imported everything and ran two small models on the same runtime, a float one and a
  small CNN at the same precision, and on ONNX Runtime the same configuration once (one-time
  allocations out of the way, the quantized kernels' included; not on TensorFlow, whose
  allocator pool would lend the second load what the first grew); the figure is the growth of
  the process's anonymous resident memory (``RssAnon``, after ``malloc_trim`` so that freed heap
  pages do not count) from before the load to after the load and one batch-1 inference: what the
  session keeps holding, codes or floats plus the runtime's own structures. The extra peak while
  an inference runs (transient dequantized weights, activations) is shown beside it, from
  ``VmHWM`` reset just before the call. File size and the bytes of codes plus scales are listed
  for comparison. 5 fresh processes per configuration (median).
- **Agreement with fp32** on a fixed input set: largest absolute difference of the output
  probabilities and the fraction of rows with the same argmax; and the largest difference from
  the NumPy reference forward of the dequantized weights (how exactly each runtime computes
  what the codes say; ONNX Runtime's accuracy level 4 quantizes activations to int8, which
  shows here).

Summary: ``int4_weight_memory_ratio`` (fc_large, ONNX Runtime, int4 / fp32 weight memory) and
``int4_batch1_latency_ratio`` (fc_large, ONNX Runtime, int4 / fp32 at batch 1), plus the same
figures for the CNN and for TensorFlow. ``--quick`` runs a small fully connected model, one
round and one memory process per runtime, on a small MLP and a small CNN, in seconds. Results:
``benchmarks/results/quant.json`` (``quant.quick.json`` in quick mode, or under ``--out``).

Run with ``iotgw bench quant [--quick] [--out DIR]`` or ``python -m benchmarks.quant``.

The modules: ``plan`` (how much, the models, a configuration), ``measure`` (checkpoints,
latency, agreement), ``memory`` (the fresh processes), ``report`` and ``run``.
"""

from benchmarks.quant.run import main, run

__all__ = ["main", "run"]
