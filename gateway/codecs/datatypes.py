"""Open Inference Protocol datatype names <-> numpy dtypes."""

from __future__ import annotations

import numpy as np

from gateway.errors import BadRequest

_TO_NUMPY: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
}
_TO_LABEL = {dt.name: label for label, dt in _TO_NUMPY.items()}


def numpy_dtype(label: object, *, what: str) -> np.dtype:
    dtype = _TO_NUMPY.get(label) if isinstance(label, str) else None
    if dtype is None:
        raise BadRequest(f"{what}: unknown datatype {label!r}; expected one of {sorted(_TO_NUMPY)}")
    return dtype


def dtype_label(dtype: np.dtype) -> str:
    """The Open Inference Protocol name of a numpy dtype (FP32, INT64, BYTES, ...)."""
    return _TO_LABEL.get(dtype.name, dtype.name)
