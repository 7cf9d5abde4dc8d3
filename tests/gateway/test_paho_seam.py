"""The MQTT fast path reaches into paho's and aiomqtt's private attributes in one module; this
fails loudly when an installed release no longer has them (or is not the pinned series)."""

from __future__ import annotations

import paho.mqtt
import pytest

from gateway.mqtt import paho_seam


async def test_the_installed_paho_and_aiomqtt_fit_the_fast_path() -> None:
    await paho_seam.check_paho()


async def test_a_missing_private_attribute_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(
        paho_seam.PRIVATE_ATTRIBUTES, "paho.mqtt.client.Client", ("_in_packet", "_gone_attr")
    )
    with pytest.raises(RuntimeError, match=r"paho\.mqtt\.client\.Client\._gone_attr is gone"):
        await paho_seam.check_paho()


async def test_another_paho_series_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(paho.mqtt, "__version__", "3.0.0")
    with pytest.raises(RuntimeError, match=r"paho-mqtt 3\.0\.0"):
        await paho_seam.check_paho()
