"""qwZ in the forward pass: which kernels are quantized and how, in the checkpoint's layout.

A kernel held in the zoo's input-major layout (Dense ``[in, out]``, Conv2D HWIO) is turned
output-major (``[out, in]``, OIHW), flattened to ``[out, in * kh * kw]`` and quantized with
``models.quant.quantize_blocks`` in blocks along that input dimension: the exact call the
checkpoint writer makes (``models.zoo_checkpoint.quantize_kernel``). The forward pass then
computes with ``fp32(q * d)`` brought back to the zoo layout, which is what both runtimes
compute from the stored codes. Biases (1-D, "small tensors") are never quantized, as in
DeepSpeed; ``min_elements`` also keeps tiny kernels in float when asked to.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from models.checkpoint import QuantizedTensor
from models.quant import check_bits, check_block_size
from models.zoo import Layer
from models.zoo_checkpoint import quantize_kernel, to_input_major, to_output_major


@dataclass(frozen=True, slots=True)
class QwZConfig:
    """Weight quantization of the forward and backward passes."""

    bits: int
    """Code width: 8, 6, 4, 3 or 2."""
    block_size: int = 32
    """Elements per block along each kernel's input dimension (a power of two, 16..4096)."""
    min_elements: int = 0
    """Kernels with fewer elements stay in float (DeepSpeed keeps small tensors unquantized)."""

    def __post_init__(self) -> None:
        check_bits(self.bits)
        check_block_size(self.block_size)

    def quantizes(self, kernel_size: int) -> bool:
        return kernel_size >= self.min_elements


def quantize_zoo_kernel(layer: Layer, kernel: np.ndarray, config: QwZConfig) -> QuantizedTensor:
    """The codes and scales of a zoo-layout kernel, in the checkpoint's layout."""
    return quantize_kernel(to_output_major(layer, kernel), config.bits, config.block_size)


def zoo_layout(layer: Layer, quantized: QuantizedTensor) -> np.ndarray:
    """``fp32(q * d)`` of a quantized kernel, back in the zoo's layout."""
    return to_input_major(layer, quantized.dequantize())
