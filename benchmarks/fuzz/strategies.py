"""Hypothesis strategies for bad (and some good) gateway input: Open Inference Protocol JSON and
its mutations, TF Serving JSON, the binary tensor extension with lying lengths, raw bytes, and
on MQTT the topic and the MQTT 5 properties (``benchmarks.fuzz.mqtt_strategies``). ``http_cases()``
and ``mqtt_strategies.mqtt_cases()`` are the two entry points; each draws a family by name so
the mix is explicit and every case is labelled.

Deeply nested or very large pieces are built from a drawn size, not element by element, so that
hypothesis's per-example choice budget goes to the structure, not to filler.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

from benchmarks.fuzz.cases import FEATURES, INPUT, MODEL, HttpCase, oipb_frame
from gateway.codecs.oip import HEADER_LENGTH

Draw = Callable[[st.SearchStrategy[Any]], Any]

DATATYPES = [
    *("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"),
    *("FP16", "FP32", "FP64", "BYTES", "BF16"),
]
# Text the broker accepts in topics and properties: no NUL, controls, surrogates or
# non-characters (Mosquitto drops the connection for those before the gateway sees anything).
TEXT = st.text(st.characters(blacklist_categories=("Cs", "Cc", "Co", "Cn")), max_size=24)
FLOATS = st.floats(allow_nan=False, allow_infinity=False)
LEAVES = st.none() | st.booleans() | st.integers() | FLOATS | TEXT
JSON = st.recursive(
    LEAVES,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)
# Numbers that break shape arithmetic: huge, negative, not integers.
DIMS = st.sampled_from(
    [0, 1, 31, 33, -1, -32, 2**31, 2**32 + 1, 2**63, 2**64, 10**30, -(2**63), 1.5, True, "32"]
)
BAD_PARAMS: dict[str, list[Any]] = {
    "timeout": [-1, 0.5, 1, 10**30, 1e308, "100", True, [], {}, None, -(10**20)],
    "priority": [-1, 2**63, 10**9, 1.5, "1", True, None, []],
    "binary_data_output": ["yes", 1, 0, None, [], {"a": 1}],
    "binary_data": [1, "true", None],
    "model_version": ["", "-1", "1.0", "99", 2**70, -1, "\u0661", True, []],
}


def floats_text(count: int) -> str:
    return "[" + ",".join("0.5" for _ in range(count)) + "]"


def dumps(doc: Any) -> bytes:
    # NaN and Infinity are written as the bare tokens Python's json emits (not valid JSON).
    return json.dumps(doc, allow_nan=True).encode()


def valid_doc(draw: Draw) -> dict[str, Any]:
    rows = draw(st.integers(1, 4))
    data: Any = [[0.25] * FEATURES for _ in range(rows)]
    if draw(st.booleans()):
        data = [x for row in data for x in row]  # flat data is valid too
    doc: dict[str, Any] = {
        "inputs": [{"name": INPUT, "datatype": "FP32", "shape": [rows, FEATURES], "data": data}]
    }
    if draw(st.booleans()):
        doc["id"] = draw(TEXT)
    if draw(st.booleans()):
        doc["parameters"] = {"binary_data_output": draw(st.booleans())}
    if draw(st.booleans()):
        doc["outputs"] = [{"name": draw(st.sampled_from(["logits", "output", "x"]))}]
    return doc


# -- OIP JSON mutations ---------------------------------------------------------------------


def _field_value(draw: Draw, key: str) -> Any:
    """A wrong value aimed at one field, or any JSON value."""
    targeted: dict[str, st.SearchStrategy[Any]] = {
        "datatype": st.sampled_from(DATATYPES) | TEXT | JSON,
        "shape": st.lists(DIMS, max_size=6) | JSON,
        "name": st.sampled_from(["", INPUT.upper(), "features ", "x" * 300]) | TEXT | JSON,
        "id": JSON | st.sampled_from([0, -1, 2**70, 1.5, True, [], {}, "", "\ud800"]),
    }
    if key in BAD_PARAMS:
        return draw(st.sampled_from(BAD_PARAMS[key]) | JSON)
    return draw(targeted.get(key, JSON))


def _set_path(doc: Any, path: list[Any], value: Any, delete: bool) -> None:
    node = doc
    for key in path[:-1]:  # containers on the way are created (or replaced) as objects
        child = node.get(key) if isinstance(node, dict) else node[key]
        if not isinstance(child, dict | list):
            child = node[key] = {}
        node = child
    last = path[-1]
    if isinstance(node, list) and not isinstance(last, int):
        return
    if delete:
        if isinstance(node, dict):
            node.pop(last, None)
        elif 0 <= last < len(node):
            del node[last]
    elif isinstance(node, list) and last >= len(node):
        node.append(value)
    else:
        node[last] = value


def _mutation_path(draw: Draw, doc: dict[str, Any]) -> list[Any]:
    top = draw(st.sampled_from(["id", "inputs", "parameters", "outputs", "input", "extra"]))
    if top == "parameters":
        doc.setdefault("parameters", {})
        if not isinstance(doc["parameters"], dict):
            return ["parameters"]
        key = draw(st.sampled_from([*BAD_PARAMS, "parameters"]) | TEXT)
        return ["parameters", key]
    if top == "outputs":
        doc["outputs"] = [{"name": "logits"}]
        return ["outputs", 0, draw(st.sampled_from(["name", "parameters"]))]
    if top == "input":
        field = draw(st.sampled_from(["name", "datatype", "shape", "data", "parameters"]))
        if field == "parameters":
            return ["inputs", 0, "parameters", draw(st.sampled_from(["binary_data_size"]) | TEXT)]
        return ["inputs", 0, field]
    return [top if top != "extra" else draw(TEXT)]


def oip_mutated(draw: Draw) -> bytes:
    """A valid request with one to three fields replaced by wrong values or removed."""
    doc = valid_doc(draw)
    for _ in range(draw(st.integers(1, 3))):
        if not isinstance(doc.get("inputs"), list) or not doc["inputs"]:
            doc["inputs"] = [{}]
        if not isinstance(doc["inputs"][0], dict):
            doc["inputs"][0] = {}
        path = _mutation_path(draw, doc)
        delete = draw(st.integers(0, 4)) == 0
        _set_path(doc, path, None if delete else _field_value(draw, str(path[-1])), delete)
    return dumps(doc)


def oip_shapes(draw: Draw) -> bytes:
    """Shapes that lie about the data: wrong products, huge or negative dims, empty data."""
    count = draw(st.sampled_from([0, 1, 31, 32, 33, 64, 96]))
    shape = draw(
        st.lists(DIMS, min_size=0, max_size=5)
        | st.sampled_from([[1, 32], [32], [1, 32, 1], [0, 32], [2**31, 2**31], [10**20]])
    )
    body = (
        f'{{"inputs":[{{"name":"{INPUT}","datatype":"FP32","shape":{json.dumps(shape)},'
        f'"data":{floats_text(count)}}}]}}'
    )
    return body.encode()


def oip_many_inputs(draw: Draw) -> bytes:
    count = draw(st.sampled_from([2, 100, 1000, 3000]))
    same_name = draw(st.booleans())
    entry = '{"name":"%s","datatype":"FP32","shape":[1,32],"data":' + floats_text(FEATURES) + "}"
    inputs = ",".join(entry % (INPUT if same_name else f"in{i}") for i in range(count))
    return f'{{"inputs":[{inputs}]}}'.encode()


def deep_nesting(draw: Draw) -> bytes:
    """Nesting far past any sane depth: of ``data``, of ``parameters``, or of the whole body,
    balanced or not."""
    depth = draw(st.sampled_from([64, 65, 500, 999, 1000, 3000, 12_000, 50_000]))
    where = draw(st.sampled_from(["data", "parameters", "input_parameters", "body", "id"]))
    opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}"), ('[{"a":', "}]")]))
    leaf = draw(st.sampled_from(["1.0", "[]", "{}", '"x"', "null"]))
    balanced = draw(st.booleans())
    nest = opener * depth + leaf + (closer * depth if balanced else "")
    if where == "body":
        return nest.encode()
    head = f'{{"inputs":[{{"name":"{INPUT}","datatype":"FP32","shape":[1,32]'
    if where == "data":
        return f'{head},"data":{nest}}}]}}'.encode()
    if where == "parameters":
        return f'{head},"data":{floats_text(FEATURES)}}}],"parameters":{{"k":{nest}}}}}'.encode()
    if where == "input_parameters":
        return f'{head},"data":{floats_text(FEATURES)},"parameters":{{"k":{nest}}}}}]}}'.encode()
    return f'{{"id":{nest},{head[1:]},"data":{floats_text(FEATURES)}}}]}}'.encode()


def oip_tokens(draw: Draw) -> bytes:
    """NaN / Infinity tokens, non-UTF-8 bytes, duplicated keys and odd escapes, spliced into an
    otherwise valid body."""
    token = draw(
        st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-0", "1E400", "0x10", "01"])
    )
    kind = draw(st.sampled_from(["data", "shape", "timeout", "priority", "id", "dup", "utf8"]))
    data = floats_text(FEATURES)
    shape, params, rid = "[1,32]", "{}", '"a"'
    if kind == "data":
        data = "[" + ",".join([token] + ["0.5"] * (FEATURES - 1)) + "]"
    elif kind == "shape":
        shape = f"[1,{token}]"
    elif kind in ("timeout", "priority"):
        params = f'{{"{kind}":{token}}}'
    elif kind == "id":
        rid = draw(st.sampled_from([token, '"\\ud800"', '"\\u0000"', '"\\udfff\\ud800"']))
    body = (
        f'{{"id":{rid},"inputs":[{{"name":"{INPUT}","datatype":"FP32","shape":{shape},'
        f'"data":{data}}}],"parameters":{params}}}'
    ).encode()
    if kind == "dup":
        dup = draw(st.sampled_from(['"inputs":7', '"inputs":[]', '"id":1', '"parameters":[]']))
        at = draw(st.sampled_from(["start", "end"]))
        return (
            b"{" + dup.encode() + b"," + body[1:]
            if at == "start"
            else body[:-1] + b"," + dup.encode() + b"}"
        )
    if kind == "utf8":
        bad = draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80"]))
        at = draw(st.integers(0, len(body)))
        return body[:at] + bad + body[at:]
    return body


def oip_bytes_json(draw: Draw) -> bytes:
    """BYTES data in JSON: strings, lone surrogates, non-strings."""
    value = draw(st.lists(TEXT | st.sampled_from(["\ud800", "\udfff"]) | JSON, max_size=4))
    doc = {"inputs": [{"name": INPUT, "datatype": "BYTES", "shape": [len(value)], "data": value}]}
    return json.dumps(doc).encode()


# -- the binary extension -------------------------------------------------------------------


def _binary_header(draw: Draw, sizes: list[Any], datatype: str = "FP32") -> bytes:
    inputs = [
        {
            "name": INPUT if i == 0 else f"in{i}",
            "datatype": datatype,
            "shape": [1, FEATURES] if datatype != "BYTES" else [draw(st.integers(0, 3))],
            "parameters": {"binary_data_size": size},
        }
        for i, size in enumerate(sizes)
    ]
    doc: dict[str, Any] = {"id": "b", "inputs": inputs}
    if draw(st.booleans()):
        doc["parameters"] = {"binary_data_output": True}
    return dumps(doc)


def _bytes_elements(draw: Draw) -> bytes:
    """BYTES tensor elements (u32 LE length + bytes) whose lengths may lie."""
    out = b""
    for _ in range(draw(st.integers(0, 3))):
        item = draw(st.binary(max_size=8))
        length = draw(st.sampled_from([len(item), len(item) + 1, 2**32 - 1, 0, 2**31]))
        out += struct.pack("<I", length) + item
    return out + draw(st.sampled_from([b"", b"\x01", b"\x01\x00\x00"]))


def binary_body(draw: Draw) -> tuple[bytes, int, str]:
    """(body, true header length, what lies): tensors sized right or wrong."""
    tensor = b"\x00\x00\x80\x3f" * FEATURES
    lie = draw(st.sampled_from(["none", "overrun", "short", "negative", "odd", "bytes", "many"]))
    if lie == "bytes":
        raw = _bytes_elements(draw)
        header = _binary_header(draw, [draw(st.sampled_from([len(raw), len(raw) + 4]))], "BYTES")
        return header + raw, len(header), lie
    size: Any = {"none": len(tensor), "overrun": len(tensor) + 4, "short": len(tensor) - 4}.get(
        lie, len(tensor)
    )
    if lie == "negative":
        size = draw(st.sampled_from([-1, -(2**63), -128]))
    elif lie == "odd":
        size = draw(st.sampled_from([1.5, "128", None, True, 2**64, [], 1e300]))
    sizes = [size] * (draw(st.integers(2, 40)) if lie == "many" else 1)
    header = _binary_header(draw, sizes)
    body = header + tensor * len(sizes)
    trailing = draw(st.sampled_from([b"", b"", b"\x00", b"\x00" * 64]))
    return body + trailing, len(header), lie


def _lying_length(draw: Draw, true_length: int, body: bytes) -> int:
    return draw(
        st.sampled_from(
            [
                true_length,
                true_length,
                true_length - 1,
                true_length + 1,
                0,
                len(body),
                len(body) + 1,
            ]
        )
        | st.integers(0, 2**32 - 1)
    )


def http_binary(draw: Draw) -> HttpCase:
    body, true_length, lie = binary_body(draw)
    value = draw(
        st.sampled_from(["{n}", "{n}", "-1", "", " 12", "1e3", "0x10", "99999999999999999999"])
    )
    if value == "{n}":
        value = str(_lying_length(draw, true_length, body))
    headers = ((HEADER_LENGTH, value), ("Content-Type", "application/octet-stream"))
    return HttpCase(f"binary/{lie}", f"/v2/models/{MODEL}/infer", body, headers)


def mqtt_frame(draw: Draw) -> bytes:
    """The OIPB frame with a u32 header length that may lie, or a truncated prefix."""
    body, true_length, _ = binary_body(draw)
    if draw(st.integers(0, 9)) == 0:
        return b"OIPB" + draw(st.binary(max_size=3))
    return oipb_frame(body, _lying_length(draw, true_length, body))


# -- TF Serving -----------------------------------------------------------------------------


def tfs_body(draw: Draw) -> bytes:
    """``instances`` / ``inputs`` with ragged rows, b64 objects, wrong names and types."""
    row = [0.5] * FEATURES
    value: Any = draw(
        st.sampled_from(
            [
                [row],
                [row, row[:-1]],  # ragged
                [row, [row]],
                [{"b64": "AAAA"}],
                [{"b64": "!!"}],
                {"b64": "AAAA"},
                [{INPUT: row}, row],  # named and unnamed rows mixed
                [{INPUT: row}],
                [{"other": row}],
                [],
                [[[[row]]]],
                row,
            ]
        )
        | JSON
    )
    key = draw(st.sampled_from(["instances", "inputs", "both", "neither"]))
    doc: dict[str, Any] = {}
    if key in ("instances", "both"):
        doc["instances"] = value
    if key in ("inputs", "both"):
        doc["inputs"] = {INPUT: value} if draw(st.booleans()) else value
    if draw(st.integers(0, 5)) == 0:
        doc["signature_name"] = draw(st.sampled_from(["serving_default", "x", 1, None]))
    return dumps(doc)


# -- cases per transport --------------------------------------------------------------------

BODIES: dict[str, Callable[[Draw], bytes]] = {
    "oip/valid": lambda draw: dumps(valid_doc(draw)),
    "oip/mutated": oip_mutated,
    "oip/shapes": oip_shapes,
    "oip/many_inputs": oip_many_inputs,
    "oip/tokens": oip_tokens,
    "oip/bytes": oip_bytes_json,
    "nesting": deep_nesting,
    "json_any": lambda draw: dumps(draw(JSON)),
    "raw_bytes": lambda draw: draw(st.binary(max_size=512)),
    "oversize": lambda draw: b'{"inputs":[' + b" " * draw(st.sampled_from([300_000, 600_000])),
}
# How often each body family is drawn (out of the list's length, plus the transport's own).
_WEIGHTS = {"oip/mutated": 8, "oip/valid": 3, "oip/tokens": 3, "oip/shapes": 3, "nesting": 3}
MIX = [f for f in BODIES for _ in range(_WEIGHTS.get(f, 2)) if f != "oversize"] + ["oversize"]
_HTTP_PATHS = st.sampled_from(
    [f"/v2/models/{MODEL}/infer"] * 6
    + [
        f"/v2/models/{MODEL}/versions/1/infer",
        f"/v2/models/{MODEL}/versions/7/infer",
        "/v2/models/no_such_model/infer",
        f"/v2/models/{MODEL}/versions/0x1/infer",
        "/v2/models/%C3%A9%F0%9F%98%80/infer",
    ]
)


@st.composite
def http_cases(draw: Draw) -> HttpCase:
    family = draw(st.sampled_from(MIX + ["binary"] * 4 + ["tfs"] * 4))
    if family == "binary":
        return http_binary(draw)
    if family == "tfs":
        path = draw(
            st.sampled_from(
                [f"/v1/models/{MODEL}:predict"] * 4
                + [f"/v1/models/{MODEL}/versions/1:predict", "/v1/models/nope:predict"]
            )
        )
        return HttpCase("tfs", path, tfs_body(draw))
    body = BODIES[family](draw)
    path = draw(_HTTP_PATHS)
    if family in ("raw_bytes", "json_any") and draw(st.integers(0, 3)) == 0:
        path = f"/v1/models/{MODEL}:predict"
    headers: tuple[tuple[str, str], ...] = ()
    if draw(st.integers(0, 7)) == 0:
        headers = ((HEADER_LENGTH, str(draw(st.integers(-5, len(body) + 5)))),)
    return HttpCase(family, path, body, headers)
