"""The MQTT adapter, in four parts:

- ``wire``: the MQTT 5 forms the adapter parses and writes itself (pure functions);
- ``paho_seam``: the one place that touches paho's and aiomqtt's private attributes (the
  per-message fast path), checked against the pinned versions;
- ``session``: connect, subscribe, reconnect with backoff;
- ``adapter``: the request flow, from a message taken to its reply and acknowledgement.
"""

from gateway.mqtt.adapter import TRANSPORT, MqttAdapter
from gateway.mqtt.paho_seam import Message
from gateway.mqtt.session import BrokerAddress
from gateway.mqtt.wire import (
    BINARY_CONTENT_TYPE,
    JSON_CONTENT_TYPE,
    ReceivedPublish,
    parse_publish,
    reply_properties,
)

__all__ = [
    "BINARY_CONTENT_TYPE",
    "JSON_CONTENT_TYPE",
    "TRANSPORT",
    "BrokerAddress",
    "Message",
    "MqttAdapter",
    "ReceivedPublish",
    "parse_publish",
    "reply_properties",
]
