"""What counts as a right answer: a 200 with a well-formed inference response, or a 4xx error
reply that names the problem (over gRPC: OK with a well-formed reply, or a client-error status
code with a message). A 503 (queue full, deadline) is an acceptable answer under load
and is counted apart; anything else (a 500, a 200 whose body does not parse as strict JSON, an
error reply without its fields) is a wrong answer to bad input.

Also here: which reply routes an MQTT request names, i.e. where the gateway must answer it.
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any

from benchmarks.fuzz.cases import CLASSES, PREFIX

OK = "ok"  # 200 with a valid inference response
REFUSED = "refused"  # 4xx error reply
OVERLOAD = "overload"  # 503 (queue full / deadline): answered, not judged wrong
WRONG = "wrong"  # anything else


def _strict_json(raw: bytes) -> Any:
    def refuse(token: str) -> Any:
        raise ValueError(f"non-JSON token {token}")

    return json.loads(raw, parse_constant=refuse)


def _valid_outputs(doc: Any, binary_section: bytes = b"") -> bool:
    """An OIP inference response: outputs with shapes whose data (or binary size) fits."""
    if not isinstance(doc, dict) or not isinstance(doc.get("outputs"), list):
        return False
    used = 0
    for out in doc["outputs"]:
        shape = out.get("shape") if isinstance(out, dict) else None
        if not isinstance(shape, list) or not shape or shape[-1] != CLASSES:
            return False
        size = (out.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            used += size
        elif not isinstance(out.get("data"), list) or len(out["data"]) != math.prod(shape):
            return False
    return used == len(binary_section)


def _valid_tfs(doc: Any) -> bool:
    value = doc.get("predictions", doc.get("outputs")) if isinstance(doc, dict) else None
    return isinstance(value, list) and bool(value)


def judge_http(status: int, body: bytes, headers: dict[str, str], tfs: bool) -> tuple[str, str]:
    """(verdict, why) for an HTTP response."""
    if status == 200:
        try:
            length = headers.get("inference-header-content-length")
            if length is not None:
                ok = _valid_outputs(_strict_json(body[: int(length)]), body[int(length) :])
            else:
                doc = _strict_json(body)
                ok = _valid_tfs(doc) if tfs else _valid_outputs(doc)
        except ValueError as exc:
            return WRONG, f"200 with a body that is not strict JSON: {exc}"
        return (OK, "200") if ok else (WRONG, "200 with a malformed inference response")
    if status == 503:
        return OVERLOAD, "503"
    if 400 <= status < 500:
        try:
            doc = _strict_json(body)
        except ValueError:
            return WRONG, f"{status} with a body that is not JSON"
        if isinstance(doc, dict) and isinstance(doc.get("error"), str):
            return REFUSED, str(status)
        return WRONG, f"{status} without an 'error' message"
    return WRONG, str(status)


def judge_mqtt(payload: bytes, status_property: str | None) -> tuple[str, str]:
    """(verdict, why) for an MQTT reply (JSON, or a binary frame for a 200)."""
    if payload.startswith(b"OIPB"):
        if len(payload) < 8:
            return WRONG, "truncated binary reply"
        (n,) = struct.unpack_from("<I", payload, 4)
        try:
            ok = _valid_outputs(_strict_json(payload[8 : 8 + n]), payload[8 + n :])
        except ValueError as exc:
            return WRONG, f"binary reply header is not strict JSON: {exc}"
        if status_property not in (None, "200"):
            return WRONG, f"binary reply with status property {status_property}"
        return (OK, "200") if ok else (WRONG, "200 with a malformed inference response")
    try:
        doc = _strict_json(payload)
    except ValueError as exc:
        return WRONG, f"reply is not strict JSON: {exc}"
    status = doc.get("status") if isinstance(doc, dict) else None
    if status_property is not None and str(status) != status_property:
        return WRONG, f"status {status} in the body but {status_property} in the property"
    if status == 200:
        return (OK, "200") if _valid_outputs(doc) else (WRONG, "200 malformed")
    if status == 503:
        return OVERLOAD, "503"
    if not isinstance(status, int) or not 400 <= status < 500:
        return WRONG, str(status)
    if isinstance(doc.get("error"), str) and isinstance(doc.get("reason"), str):
        return REFUSED, str(status)
    return WRONG, f"{status} without 'error' and 'reason'"


def in_namespace(response_topic: str | None, model: str, device: str) -> bool:
    """Whether a Response Topic lies in the device's reply namespace, the gateway's default
    ``mqtt.response_topic_pattern`` ``<prefix>/infer/+/res/<device>/#``."""
    if not response_topic or "+" in response_topic or "#" in response_topic:
        return False
    levels = response_topic.split("/")
    return len(levels) >= 5 and levels[:2] == [PREFIX, "infer"] and levels[3:5] == ["res", device]


def reply_routes(topic: str, v5: bool, response_topic: str | None) -> list[str]:
    """Where the gateway must answer a request published on ``topic``: nowhere when the topic
    is not a request topic (``<prefix>/infer/<model>/req/<device>``, both levels non-empty);
    else on its Response Topic when that lies in the device's reply namespace (MQTT 5), and
    otherwise on the device's own reply topic (the answer to a Response Topic outside the
    namespace, or with wildcards, is a 403 there)."""
    levels = topic.split("/")
    if len(levels) != 5 or levels[:2] != [PREFIX, "infer"] or levels[3] != "req":
        return []
    model, device = levels[2], levels[4]
    if not model or not device:
        return []
    own = f"{PREFIX}/infer/{model}/res/{device}"
    if v5 and response_topic and in_namespace(response_topic, model, device):
        return [response_topic, own]
    return [own]


# The gRPC status codes that say "the request is wrong" (HTTP's 4xx); UNAVAILABLE with the
# gateway's reason is its 503. INTERNAL, UNKNOWN, DATA_LOSS, UNIMPLEMENTED (on a served call)
# are wrong answers.
GRPC_CLIENT_ERRORS = frozenset(
    {
        "INVALID_ARGUMENT",
        "NOT_FOUND",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "OUT_OF_RANGE",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "UNAUTHENTICATED",
    }
)


def judge_grpc(
    code: str, details: str, reason: str | None, reply: bytes, method: str
) -> tuple[str, str]:
    """(verdict, why) for a gRPC call's end: its status code's name, details, the gateway's
    ``iotgw-reason`` trailer, and the reply's bytes when it is OK."""
    if code == "OK":
        return (OK, "OK") if _valid_grpc_reply(reply, method) else (WRONG, "OK, malformed reply")
    if code in GRPC_CLIENT_ERRORS:
        return (REFUSED, code) if details else (WRONG, f"{code} without a message")
    if code == "UNAVAILABLE" and reason is not None:
        return OVERLOAD, f"UNAVAILABLE ({reason})"
    return WRONG, f"{code}: {details[:120]}"


def _valid_grpc_reply(reply: bytes, method: str) -> bool:
    from gateway.grpc.messages import message

    try:
        if method.endswith("/ModelInfer"):
            msg = message("inference.ModelInferResponse").FromString(reply)
            return bool(msg.outputs) and all(o.shape[-1] == CLASSES for o in msg.outputs)
        if method.endswith("/Predict"):
            out = message("tensorflow.serving.PredictResponse").FromString(reply)
            return bool(out.outputs)
    except Exception:  # a reply that does not parse is malformed, whatever the parser raised
        return False
    return True  # the read-only calls: any message they answer with
