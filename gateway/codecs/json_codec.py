"""The JSON every codec reads and writes: orjson where it gives what the standard library gives,
the standard library where it would not, so that choosing orjson changes the CPU a request
costs and nothing a device can observe but the spelling of numbers and escapes.

Reading (``loads``). orjson parses a request 5-7x faster than ``json``. Every document it
refuses goes to the standard parser, which then decides as it always did, with its own words
in the refusal: malformed JSON of any kind; NaN, Infinity and numbers beyond a double's range
(the standard parser reads them as floats, and the service refuses them naming the tensor);
UTF-16/32 bodies, a UTF-8 byte order mark, lone surrogates; nesting past orjson's 1024 levels
(the standard parser's ``RecursionError``, which ``limits.load_json`` maps to "nested too
deeply"). The standard parser's guard stops at about 1,000 levels less the interpreter's call
stack, so a document nested between the two guards now parses, and meets the protocol's own
checks (tensor data no deeper than its dimension limit, scalar parameters, a string id) as any
other. One document orjson takes but reads differently: an integer beyond 64 bits becomes a
float there and stays an integer here (a big integer in FP32 data is refused today, and would
be taken), so a body holding one goes to the standard parser too. Found by a C-speed scan for
19 digits in a row that do not follow a '.', an exponent, a quote or a letter (digits inside a
string may send a body the slow way; they never change its meaning).

Writing (``writer_for``). orjson writes numpy arrays itself (``OPT_SERIALIZE_NUMPY``), without
the Python list ``tolist`` builds. Floating-point tensors are written as float64, so each
number is the shortest text that reads back as the very double ``tolist`` + ``json`` wrote
(orjson would write FP32 values as the shortest text for a float32, which a client reading
doubles would see differ); the spelling may differ (``1e-5`` for ``1e-05``). A reply with
NaN or an infinity in a tensor is written by ``json``, with the ``NaN`` / ``Infinity`` tokens it
has always carried (orjson would write ``null``), as is anything orjson cannot write (integers
beyond 64 bits, lone surrogates in a request id echoed back).

The codec is chosen once per process (``serving.json_codec``, ``select``); ``stdlib`` is the
standard library alone, kept for the before/after benchmark.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import orjson

JsonCodec = Literal["orjson", "stdlib"]
_OPTIONS = orjson.OPT_SERIALIZE_NUMPY
_codec: JsonCodec = "orjson"


def select(codec: JsonCodec) -> None:
    """The codec of this process, set once at start-up (``serving.json_codec``)."""
    global _codec
    if codec not in ("orjson", "stdlib"):
        raise ValueError(f"unknown JSON codec {codec!r}")
    _codec = codec


def selected() -> JsonCodec:
    return _codec


# -- reading -----------------------------------------------------------------------------------


def _digit_classes() -> bytes:
    """A ``bytes.translate`` table: digits -> '0'; what a digit run may follow inside a number
    or a string ('.', an exponent, a quote, letters) -> '.'; everything else -> ' '."""
    table = bytearray(b" " * 256)
    for c in b"0123456789":
        table[c] = ord("0")
    for c in b'."abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ':
        table[c] = ord(".")
    return bytes(table)


_CLASSES = _digit_classes()
# 19 digits starting a number's integer part: at or past 2**63 in magnitude, where orjson
# turns an integer into a float.
_BIG_INTEGER = b" " + b"0" * 19


def _may_hold_big_integer(raw: bytes | str) -> bool:
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    return (b" " + data).translate(_CLASSES).find(_BIG_INTEGER) >= 0


def loads(raw: bytes | str) -> Any:
    """``json.loads(raw)``'s result, its exceptions included (``json.JSONDecodeError``,
    ``UnicodeDecodeError``, ``RecursionError``)."""
    if _codec == "orjson" and not _may_hold_big_integer(raw):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass  # the standard parser decides, and words the refusal, as it always did
    return json.loads(raw)


# -- writing -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Writer:
    """How one reply is written: ``value`` turns each output tensor into what ``dumps`` takes."""

    value: Callable[[np.ndarray], Any]
    dumps: Callable[[Any], bytes]


def _orjson_value(arr: np.ndarray) -> np.ndarray:
    # orjson writes only native-endian, C-contiguous arrays; floats as float64 (see above).
    if arr.dtype.kind == "f":
        return np.ascontiguousarray(arr, dtype=np.float64)
    return np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("="))


def _as_python(obj: Any) -> Any:
    """Arrays and numpy scalars for ``json``, and what orjson cannot write itself (0-d and
    object arrays)."""
    if isinstance(obj, np.ndarray | np.generic):
        return obj.tolist()
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def _stdlib_dumps(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":"), default=_as_python).encode()


def _orjson_dumps(doc: Any) -> bytes:
    try:
        return orjson.dumps(doc, default=_as_python, option=_OPTIONS)
    except orjson.JSONEncodeError:
        return _stdlib_dumps(doc)  # integers beyond 64 bits, lone surrogates


def _tolist(arr: np.ndarray) -> Any:
    return arr.tolist()


_ORJSON = Writer(_orjson_value, _orjson_dumps)
_STDLIB = Writer(_tolist, _stdlib_dumps)


def writer_for(arrays: Iterable[np.ndarray]) -> Writer:
    """The writer for a reply carrying ``arrays`` as JSON: the standard library's where a
    floating-point one holds NaN or an infinity (or where it is the process's codec)."""
    if _codec == "stdlib":
        return _STDLIB
    for arr in arrays:
        if arr.dtype.kind == "f" and arr.size and not np.isfinite(arr).all():
            return _STDLIB
    return _ORJSON


def dumps(doc: Any) -> bytes:
    """A document without tensors (an error envelope): compact JSON."""
    return _orjson_dumps(doc) if _codec == "orjson" else _stdlib_dumps(doc)
