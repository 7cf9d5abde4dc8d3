"""What one device may make the gateway do over MQTT (docs/mqtt.md, "Trust between devices").

- **Reply namespace**: a Response Topic must match ``mqtt.response_topic_pattern``, an MQTT topic
  filter whose ``{prefix}``, ``{model}`` and ``{device}`` are filled in per request and which is
  matched as a broker matches a subscription (``#`` also matches its parent level). A Response
  Topic outside it is not used: the request is refused (403) on the device's own reply topic.
- **Identity**: the device id is the request topic's last level. Only the broker can bind it to
  the publisher's authenticated account (a pattern ACL, deploy/mosquitto/acl); a subscriber is
  never told who published. With ``mqtt.device_identity = "user_property"`` the gateway also
  requires an MQTT 5 user property, stamped by a broker plugin or rule, to name the same device.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from gateway.errors import Forbidden

PLACEHOLDER = re.compile(r"\{(prefix|model|device)\}")
_BRACES = re.compile(r"[{}]")


class ForbiddenResponseTopic(Forbidden):
    reason = "forbidden_response_topic"


class ForbiddenIdentity(Forbidden):
    reason = "forbidden_identity"


def check_pattern(pattern: str) -> str:
    """``pattern`` if it is a topic filter with only known placeholders; ValueError otherwise."""
    if _BRACES.search(PLACEHOLDER.sub("", pattern)):
        raise ValueError(
            f"response topic pattern {pattern!r}: only {{prefix}}, {{model}} and {{device}} "
            "may appear in braces"
        )
    levels = pattern.split("/")
    for i, level in enumerate(levels):
        if ("#" in level and (level != "#" or i != len(levels) - 1)) or (
            "+" in level and level != "+"
        ):
            raise ValueError(
                f"response topic pattern {pattern!r}: '+' must fill a whole level and '#' "
                "the whole last one"
            )
    return pattern


@dataclass(frozen=True, slots=True)
class _Level:
    """One level of the pattern: a wildcard ("+" or "#"), or text that may hold placeholders
    (split into literal parts and placeholder names, filled in per request)."""

    wildcard: str | None
    parts: tuple[str, ...] = ()
    templated: bool = False

    def text(self, model: str, device: str) -> str:
        if not self.templated:
            return self.parts[0]
        if len(self.parts) == 3 and not self.parts[0] and not self.parts[2]:
            return model if self.parts[1] == "model" else device  # the usual: a whole level
        # Split once, filled per request: a model or device id that itself contains
        # "{device}" cannot be substituted twice.
        return "".join(
            model if i % 2 and p == "model" else device if i % 2 else p
            for i, p in enumerate(self.parts)
        )


class ReplyNamespace:
    """The Response Topics one device may name, from ``mqtt.response_topic_pattern``."""

    def __init__(self, pattern: str, prefix: str) -> None:
        check_pattern(pattern)
        self.pattern = pattern
        # The prefix may span levels ("site/iotgw"), so it is filled in before splitting.
        filled = PLACEHOLDER.sub(lambda m: prefix if m[1] == "prefix" else m[0], pattern)
        self._levels = tuple(_level(text) for text in filled.split("/"))
        self._prefix = prefix

    def allows(self, topic: str, model: str, device: str) -> bool:
        """Whether ``topic`` (a Response Topic) lies in ``device``'s namespace for ``model``.
        A topic with a wildcard is never a valid topic name, so it is never allowed."""
        if "+" in topic or "#" in topic:
            return False
        levels = topic.split("/")
        for i, want in enumerate(self._levels):
            # As in MQTT, a pattern starting with a wildcard does not match "$" topics.
            if i == 0 and want.wildcard and topic.startswith("$"):
                return False
            if want.wildcard == "#":
                return True
            if i >= len(levels):
                return False
            if want.wildcard is None and levels[i] != want.text(model, device):
                return False
        return len(levels) == len(self._levels)

    def for_device(self, model: str, device: str) -> str:
        """The pattern as it applies to one device (for error messages)."""
        values = {"prefix": self._prefix, "model": model, "device": device}
        return PLACEHOLDER.sub(lambda m: values[m[1]], self.pattern)


def _level(text: str) -> _Level:
    if text in ("+", "#"):
        return _Level(text)
    parts = tuple(PLACEHOLDER.split(text))  # literal, name, literal, name, ..., literal
    return _Level(None, parts, templated=len(parts) > 1)


class DeviceTrust:
    """The checks of one request's route: the Response Topic it names and, optionally, the
    publisher identity a broker stamped on it. Returns the refusal, or None."""

    def __init__(
        self,
        *,
        namespace: ReplyNamespace,
        identity: Literal["topic", "user_property"],
        identity_property: str,
    ) -> None:
        self.namespace = namespace
        self._identity_property = identity_property if identity == "user_property" else None

    def refusal(
        self,
        model: str,
        device: str,
        response_topic: str | None,
        user_properties: Sequence[tuple[str, str]] | None,
    ) -> Forbidden | None:
        if self._identity_property is not None:
            claimed = [v for k, v in user_properties or () if k == self._identity_property]
            if claimed != [device]:
                return ForbiddenIdentity(
                    f"the request topic names device {device!r} but the broker's "
                    f"{self._identity_property!r} user property names {claimed or 'nobody'}"
                )
        if not response_topic:
            return None
        unfit = _unfit_topic(response_topic)
        if unfit is not None:
            return ForbiddenResponseTopic(f"Response Topic {_shown(response_topic)}: {unfit}")
        if not self.namespace.allows(response_topic, model, device):
            return ForbiddenResponseTopic(
                f"Response Topic {_shown(response_topic)} is outside device {device!r}'s reply "
                f"namespace: it must match {self.namespace.for_device(model, device)!r}"
            )
        return None


# Reply topics a broker may refuse to take from the gateway: Mosquitto disconnects a client that
# publishes to more than 200 levels, and a disconnect leaves the request unacknowledged, so it
# would come back after every reconnect. Far below any broker's limits, far above real use.
MAX_REPLY_TOPIC_LEVELS = 32
MAX_REPLY_TOPIC_BYTES = 1024


def _unfit_topic(topic: str) -> str | None:
    levels = topic.count("/") + 1
    if levels > MAX_REPLY_TOPIC_LEVELS:
        return f"{levels} levels, at most {MAX_REPLY_TOPIC_LEVELS} are answered"
    size = len(topic.encode("utf-8", "surrogatepass"))
    if size > MAX_REPLY_TOPIC_BYTES:
        return f"{size} bytes, at most {MAX_REPLY_TOPIC_BYTES} are answered"
    if "\x00" in topic:
        return "holds a NUL character"
    return None


def _shown(topic: str) -> str:
    return repr(topic if len(topic) <= 120 else topic[:120] + "...")
