"""The refusal log (gateway/mqtt/refusals.py): one INFO line per device per interval, the rest
at DEBUG and counted into the next line, the devices remembered bounded. The clock is injected;
tests/gateway/test_mqtt_trust.py checks the line a real refused request writes."""

from __future__ import annotations

import logging

import pytest

from gateway.mqtt.refusals import RefusalLog
from gateway.mqtt.trust import ForbiddenResponseTopic


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _infos(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.message for r in caplog.records if r.levelno == logging.INFO]


def test_one_info_line_per_device_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="gateway.mqtt")
    clock = Clock()
    refusals = RefusalLog(interval_s=60, clock=clock)
    refusal = ForbiddenResponseTopic("Response Topic 'my/replies' is outside ...")
    for _ in range(5):
        refusals.refused("dev1", refusal, "iotgw/infer/m/res/dev1")
    refusals.refused("dev2", refusal, "iotgw/infer/m/res/dev2")
    infos = _infos(caplog)
    assert len(infos) == 2
    assert "device 'dev1' (403 forbidden_response_topic)" in infos[0]
    assert "'my/replies'" in infos[0] and "went to iotgw/infer/m/res/dev1" in infos[0]
    assert "device 'dev2'" in infos[1]
    assert sum(r.levelno == logging.DEBUG for r in caplog.records) == 4
    caplog.clear()
    clock.now += 59.9
    refusals.refused("dev1", refusal, "iotgw/infer/m/res/dev1")
    assert _infos(caplog) == []
    clock.now += 0.1  # a minute after dev1's first line
    refusals.refused("dev1", refusal, "iotgw/infer/m/res/dev1")
    [line] = _infos(caplog)
    assert "5 more refused since its last line" in line


def test_the_devices_remembered_are_bounded(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gateway.mqtt")
    refusals = RefusalLog(interval_s=60, devices=2, clock=Clock())
    refusal = ForbiddenResponseTopic("outside")
    for device in ("a", "b", "c", "a"):  # "a" was forgotten when "c" came: it logs again
        refusals.refused(device, refusal, f"t/{device}")
    assert len(_infos(caplog)) == 4
    assert len(refusals) == 2
