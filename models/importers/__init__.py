"""Importers into block-quantized checkpoints (``iotgw quantize``).

- ``from_safetensors``: an fp32/fp16/bf16 safetensors state dict (one file, or shards with a
  ``model.safetensors.index.json``, as DeepSpeed's ``zero_to_fp32.py --safe_serialization``
  writes) plus an architecture mapping;
- ``from_keras``: a Keras model (a ``.keras`` file, loaded in safe mode, or a model object);
- ``from_onnx``: an fp32 ONNX model, its MatMul/Gemm and Conv weights quantized and the graph
  rewritten (served by ONNX Runtime only).

Each returns the checkpoint and an ``ImportReport`` listing what it quantized and what it kept
in float. Importing this package imports neither TensorFlow nor onnx.
"""
