"""Open Inference Protocol datatype names <-> numpy dtypes."""

from __future__ import annotations

import numpy as np

from gateway.errors import BadRequest
from models.datatypes import OIP_DATATYPES

_TO_NUMPY = OIP_DATATYPES
_TO_LABEL = {dt.name: label for label, dt in _TO_NUMPY.items()}


def numpy_dtype(label: object, *, what: str) -> np.dtype:
    dtype = _TO_NUMPY.get(label) if isinstance(label, str) else None
    if dtype is None:
        raise BadRequest(f"{what}: unknown datatype {label!r}; expected one of {sorted(_TO_NUMPY)}")
    return dtype


def dtype_label(dtype: np.dtype) -> str:
    """The Open Inference Protocol name of a numpy dtype (FP32, INT64, BYTES, ...)."""
    return _TO_LABEL.get(dtype.name, dtype.name)
