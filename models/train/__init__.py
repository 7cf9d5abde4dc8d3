"""The ZeRO++-style trainer behind ``iotgw train``.

Training computes every quantized layer with dequant(quant(W)) from ``models.quant``'s qwZ rule
(blocks along each kernel's input dimension, the layout the checkpoint stores), applies the
straight-through gradient to fp32 master weights, simulates W data-parallel workers whose
gradients are averaged through qgZ's int4 two-hop scheme, moves the batch size with SimiGrad's
rule, and exports the very codes and scales of its last forward pass, so the gateway serves
what training computed with and no post-training quantization happens anywhere.

Modules, each on one concern: ``data`` (the digits split and the batch sampler), ``qwz``,
``qgz``, ``simigrad``, ``traffic`` (bytes per step of ZeRO-3 and ZeRO++), ``network`` (a zoo
``ModelSpec`` as a Keras model), ``trainer`` (the custom training step and its resumable
state), ``export``, ``report`` and ``cli``. TensorFlow is imported only by ``network``,
``trainer``, ``export`` and ``report``.
"""
