"""Which MQTT version to speak to a broker: MQTT 5 when it accepts it, else MQTT 3.1.1.

``iotgw serve`` without ``--broker`` embeds Mosquitto (MQTT 5) when one is installed and amqtt
(MQTT 3.1.1 only) otherwise, so the simulator cannot know in advance which one it meets. Before
the devices connect, one probe connection offers MQTT 5:

- accepted: MQTT 5;
- refused for its version (CONNACK code 132, "Unsupported protocol version", or a 3.1.1
  broker's code 1) or left unanswered until the connect timeout (some 3.1.1 brokers say nothing
  to a CONNECT they cannot parse): with ``auto`` a second probe offers MQTT 3.1.1 and, when it
  is accepted, the run goes on in 3.1.1 after one log line saying so; with an explicit ``5``
  the run stops with one line naming the option that selects 3.1.1;
- refused for another reason (credentials, authorisation) or unreachable: that error, as is.

Every probe is bounded by the connect timeout, so nothing waits forever.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from dataclasses import replace
from typing import Literal

import aiomqtt
from paho.mqtt.reasoncodes import ReasonCode

from device_sim.mqtt_devices import MqttOptions, MqttVersion, new_client

log = logging.getLogger("device_sim")

VersionChoice = Literal["auto", "5", "3.1.1"]
# CONNACK codes meaning "not this protocol version": MQTT 5's 132, MQTT 3.1.1's 1.
_VERSION_REFUSED = {132, 1}
# aiomqtt's message when the CONNACK did not come within the client's timeout.
_NO_CONNACK = "Operation timed out"


class ProtocolMismatch(ConnectionError):
    """The broker does not speak the MQTT version asked for; the message names the option."""


def _version_refused(exc: aiomqtt.MqttError) -> bool:
    # MqttConnectError (not exported) is the MqttCodeError of a refused CONNECT.
    if isinstance(exc, aiomqtt.MqttCodeError):
        rc = exc.rc
        value = rc.value if isinstance(rc, ReasonCode) else rc
        return value in _VERSION_REFUSED
    return False


async def _probe(options: MqttOptions, version: MqttVersion) -> str | None:
    """None when the broker accepts ``version``; why not when it refuses that version or does
    not answer; any other failure is raised."""
    client = new_client(replace(options, version=version), f"sim-probe-{secrets.token_hex(4)}")
    try:
        await client.__aenter__()
    except aiomqtt.MqttError as exc:
        if _version_refused(exc):
            return f"refused MQTT {version} ({exc})"
        if str(exc) != _NO_CONNACK:
            raise
        # A connect that timed out leaves paho's socket open: close it.
        with contextlib.suppress(aiomqtt.MqttError):
            await client.__aexit__(None, None, None)
        return f"did not answer an MQTT {version} CONNECT within {options.connect_timeout_s:g} s"
    with contextlib.suppress(aiomqtt.MqttError):
        await client.__aexit__(None, None, None)
    return None


async def negotiate_version(
    options: MqttOptions, choice: VersionChoice, *, option_for_311: str
) -> MqttVersion:
    """The version the devices use; ``option_for_311`` (e.g. ``--transport mqtt311``) is named
    in the error when an explicit MQTT 5 is refused."""
    if choice == "3.1.1":
        return "3.1.1"
    why_not_5 = await _probe(options, "5")
    if why_not_5 is None:
        return "5"
    where = str(options.broker)
    if choice == "5":
        raise ProtocolMismatch(
            f"the broker at {where} {why_not_5}; for an MQTT 3.1.1 broker use {option_for_311}"
        )
    why_not_311 = await _probe(options, "3.1.1")
    if why_not_311 is not None:
        raise ConnectionError(f"the broker at {where} {why_not_5} and {why_not_311}")
    log.warning(
        "the broker at %s %s: using MQTT 3.1.1 (as %s would)", where, why_not_5, option_for_311
    )
    return "3.1.1"
