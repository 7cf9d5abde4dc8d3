"""The MQTT wire forms the adapter reads and writes itself, as pure functions: an incoming MQTT 5
PUBLISH parsed into a plain record, and a reply's MQTT 5 properties serialised once. paho's own
code stays the fallback for anything these do not know (see ``paho_seam``)."""

from __future__ import annotations

import struct
from dataclasses import dataclass

BINARY_CONTENT_TYPE = "application/vnd.iotgw.oip+binary"
JSON_CONTENT_TYPE = "application/json"


class RequestProperties:
    """The properties of an incoming request, as attributes named like paho's ``Properties``
    (absent when the request did not carry them)."""

    __slots__ = (
        "ContentType",
        "CorrelationData",
        "MessageExpiryInterval",
        "PayloadFormatIndicator",
        "ResponseTopic",
        "SubscriptionIdentifier",
        "UserProperty",
    )
    ContentType: str
    CorrelationData: bytes
    MessageExpiryInterval: int
    PayloadFormatIndicator: int
    ResponseTopic: str
    SubscriptionIdentifier: list[int]
    UserProperty: list[tuple[str, str]]


@dataclass(slots=True)
class ReceivedPublish:
    """An incoming PUBLISH with the fields the adapter reads from paho's ``MQTTMessage``."""

    topic: str
    payload: bytes
    qos: int
    mid: int
    properties: RequestProperties


def parse_publish(header: int, data: bytes) -> ReceivedPublish | None:
    """An MQTT 5 PUBLISH (fixed header byte, then the rest of the packet), or None when it is
    not a plain QoS 0/1 request this parser knows (paho's decoder then takes it)."""
    qos = (header >> 1) & 0x03
    if qos == 2:
        return None
    (topic_len,) = _U16.unpack_from(data, 0)
    pos = 2 + topic_len
    if topic_len == 0:
        return None  # a topic alias: paho resolves those
    topic = data[2:pos].decode()
    mid = 0
    if qos:
        (mid,) = _U16.unpack_from(data, pos)
        pos += 2
    length, pos = _varint(data, pos)
    end = pos + length
    if end > len(data):
        raise ValueError("properties run past the packet")
    props = RequestProperties()
    while pos < end:
        ident = data[pos]
        pos += 1
        if ident in (3, 8, 9):  # Content Type, Response Topic (UTF-8), Correlation Data
            (n,) = _U16.unpack_from(data, pos)
            value = data[pos + 2 : pos + 2 + n]
            pos += 2 + n
            if ident == 9:
                props.CorrelationData = value
            elif ident == 8:
                props.ResponseTopic = value.decode()
            else:
                props.ContentType = value.decode()
        elif ident == 2:  # Message Expiry Interval
            (props.MessageExpiryInterval,) = _U32.unpack_from(data, pos)
            pos += 4
        elif ident == 1:  # Payload Format Indicator
            props.PayloadFormatIndicator = data[pos]
            pos += 1
        elif ident == 38:  # User Property (a string pair; may repeat)
            (n,) = _U16.unpack_from(data, pos)
            key = data[pos + 2 : pos + 2 + n].decode()
            pos += 2 + n
            (n,) = _U16.unpack_from(data, pos)
            value_text = data[pos + 2 : pos + 2 + n].decode()
            pos += 2 + n
            pairs = getattr(props, "UserProperty", None) or []
            pairs.append((key, value_text))
            props.UserProperty = pairs
        elif ident == 11:  # Subscription Identifier (may repeat)
            number, pos = _varint(data, pos)
            ids = getattr(props, "SubscriptionIdentifier", None) or []
            ids.append(number)
            props.SubscriptionIdentifier = ids
        else:
            return None
    if pos != end:
        raise ValueError("properties overrun their length")
    return ReceivedPublish(topic, data[end:], qos, mid, props)


_U16 = struct.Struct("!H")
_U32 = struct.Struct("!I")


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """An MQTT Variable Byte Integer at ``pos``: (value, position after it)."""
    value = shift = 0
    for _ in range(4):
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise ValueError("malformed variable byte integer")


class _PackedProperties:
    """MQTT 5 reply properties serialised once: paho only calls ``pack()`` on the properties of
    a PUBLISH it sends, and building a paho ``Properties`` per reply costs tens of µs."""

    __slots__ = ("_packed",)

    def __init__(self, packed: bytes) -> None:
        self._packed = packed

    def pack(self) -> bytes:
        return self._packed


def _encode_varint(value: int) -> bytes:
    """An MQTT Variable Byte Integer."""
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _utf8(value: str | bytes) -> bytes:
    data = value.encode() if isinstance(value, str) else value
    return struct.pack("!H", len(data)) + data


_REPLY_PROPERTY_PARTS: dict[tuple[bool, int], tuple[bytes, bytes]] = {}


def reply_properties(binary: bool, status: int, correlation: bytes | None) -> _PackedProperties:
    """Content Type, Correlation Data and the ``status`` user property of a reply, in the
    byte order paho's ``Properties.pack`` would produce (identifier order)."""
    parts = _REPLY_PROPERTY_PARTS.get((binary, status))
    if parts is None:
        content_type = BINARY_CONTENT_TYPE if binary else JSON_CONTENT_TYPE
        parts = (b"\x03" + _utf8(content_type), b"\x26" + _utf8("status") + _utf8(str(status)))
        _REPLY_PROPERTY_PARTS[(binary, status)] = parts
    head, user = parts
    body = head + (b"\x09" + _utf8(correlation) if correlation is not None else b"") + user
    return _PackedProperties(_encode_varint(len(body)) + body)


def with_status(reply: bytes) -> bytes:
    """A JSON success reply with ``"status": 200`` appended: MQTT 3.1.1 devices have no user
    properties to read it from."""
    return reply[:-1] + b',"status":200}'
