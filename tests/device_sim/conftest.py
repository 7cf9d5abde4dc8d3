"""A real Mosquitto for the device simulator's tests, started once per session on a free
loopback port (never skipped: without Mosquitto these tests cannot say anything)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.brokers import Broker
from tests.brokers import mosquitto as start_mosquitto

# The tests name the fixture's type after the broker they run.
Mosquitto = Broker


@pytest.fixture(scope="session")
def mosquitto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    # The test responder is one client receiving every device's requests: tests/brokers.py
    # raises the broker's per-client queue (default 1000) so a burst is not dropped as losses.
    with start_mosquitto(tmp_path_factory.mktemp("mosquitto")) as broker:
        yield broker
