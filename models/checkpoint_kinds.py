"""The architecture kinds a checkpoint can hold (``architecture["kind"]`` in its header).

A leaf: the modules that write a kind (``zoo_checkpoint``, ``importers.from_onnx``) and the one
that dispatches on it (``checkpoint_graphs``) all import it, so none imports another for a name.
"""

ZOO_KIND = "zoo"  # a ModelSpec of the zoo, rebuilt for either runtime
ONNX_KIND = "onnx"  # an imported ONNX graph, which only ONNX Runtime serves
