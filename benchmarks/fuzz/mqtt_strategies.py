"""Hypothesis strategies for the MQTT side of the fuzz run: the request topic (right, or wrong
in each way a device can get it wrong), the MQTT 5 Response Topic inside and outside the
device's reply namespace, and the other properties; payloads come from the body families of
``benchmarks.fuzz.strategies``."""

from __future__ import annotations

from hypothesis import strategies as st

from benchmarks.fuzz.cases import MODEL, PREFIX, REPLY_ROOT, SEQ, MqttCase, request_topic
from benchmarks.fuzz.strategies import BODIES, MIX, TEXT, Draw, mqtt_frame

_TOPIC_KINDS = ["ok"] * 8 + [
    "unknown_model",
    "empty_device",
    "empty_model",
    "levels",
    "long",
    "unicode",
]


def topic_template(draw: Draw) -> tuple[str, str]:
    """(kind, topic): the request topic, right or wrong. The device always carries {n}."""
    kind = draw(st.sampled_from(_TOPIC_KINDS))
    device = f"fz{SEQ}"
    if kind == "unknown_model":
        return kind, request_topic(draw(st.sampled_from(["nope", "SENSOR_MLP", "é"])), device)
    if kind == "empty_device":
        return kind, request_topic(MODEL, "")
    if kind == "empty_model":
        return kind, request_topic("", device)
    if kind == "levels":
        return kind, draw(
            st.sampled_from(
                [
                    f"{PREFIX}/infer/{MODEL}/req/{device}/extra",
                    f"{PREFIX}/infer/{MODEL}/req",
                    f"{PREFIX}/infer/{MODEL}/res/{device}x",
                    f"{PREFIX}/infer/{MODEL}/{device}",
                    f"{PREFIX}/infer/{MODEL}/REQ/{device}",
                    f"{PREFIX}//infer/{MODEL}/req/{device}",
                ]
            )
        )
    if kind == "long":
        return kind, request_topic(MODEL, device + "d" * draw(st.sampled_from([200, 5000, 60000])))
    if kind == "unicode":
        text = draw(TEXT.filter(lambda t: "/" not in t and "+" not in t and "#" not in t))
        return kind, request_topic(MODEL, f"{device}{text}")
    return kind, request_topic(MODEL, device)


def response_topic(draw: Draw) -> str | None:
    """A Response Topic in the device's reply namespace (``<prefix>/infer/<model>/res/<device>``
    and below), or outside it: elsewhere, another device's, with wildcards, the gateway's own
    request topic (a reply loop), empty."""
    own = f"{PREFIX}/infer/{MODEL}/res/fz{SEQ}"
    return draw(
        st.sampled_from(
            [
                f"{own}/r",
                f"{own}/r",
                own,
                f"{own}/" + "x/" * 200,
                f"{own}/é😀",
                f"{own}/+",
                f"{own}/#",
                f"{REPLY_ROOT}/{SEQ}/r",
                f"{PREFIX}/infer/{MODEL}/res/other{SEQ}",  # another device's namespace
                f"{PREFIX}/infer/{MODEL}/req/loop{SEQ}",  # a request topic: a reply loop
                "",
            ]
        )
        | st.none()
    )


@st.composite
def mqtt_cases(draw: Draw) -> MqttCase:
    family = draw(st.sampled_from(MIX + ["frame"] * 4))
    payload = mqtt_frame(draw) if family == "frame" else BODIES[family](draw)
    kind, topic = topic_template(draw)
    if kind != "ok":
        family = f"{family}+topic/{kind}"
    if not draw(st.booleans()):
        return MqttCase(family, False, topic, payload)
    user = draw(st.sampled_from([(), (("k", "v"),), (("status", "500"),) * 3])) or ()
    if draw(st.integers(0, 9)) == 0:
        user = tuple((f"k{i}", "v" * 100) for i in range(draw(st.integers(10, 200))))
    return MqttCase(
        family,
        True,
        topic,
        payload,
        response_topic=response_topic(draw),
        correlation=draw(st.none() | st.binary(max_size=16) | st.just(b"c" * 65_000)),
        content_type=draw(
            st.none()
            | st.sampled_from(["application/json", "application/vnd.iotgw.oip+binary"])
            | TEXT
        ),
        expiry_s=draw(st.none() | st.sampled_from([0, 1, 2**32 - 1])),
        user_properties=user,
    )
