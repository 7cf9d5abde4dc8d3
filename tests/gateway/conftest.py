"""Fixtures of the gateway tests.

Async tests of this package run on one session-wide event loop (each module sets
``pytestmark = pytest.mark.asyncio(loop_scope="session")``) so that the in-process gateway
serving the demo repository is started once and shared by every test that does not change it.
Tests that change knobs, limits or the repository start their own gateway.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from gateway.main import Gateway
from tests.brokers import Broker, mosquitto
from tests.gateway.helpers import Reference, base_url, running_gateway


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """A real Mosquitto per test module (modules that need another configuration define their
    own ``broker``)."""
    with mosquitto(tmp_path_factory.mktemp("mosquitto")) as b:
        yield b


@pytest.fixture(scope="session")
def reference(demo_repo: Path) -> Iterator[Reference]:
    """Direct runtime calls on the demo repository's model versions."""
    ref = Reference(demo_repo)
    yield ref
    ref.close()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def gateway(
    demo_repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Gateway]:
    """One in-process gateway serving the demo repository, shared by the read-only tests."""
    async with running_gateway(demo_repo, tmp_path_factory.mktemp("gw-cache")) as gw:
        yield gw


@pytest.fixture(scope="session")
def url(gateway: Gateway) -> str:
    return base_url(gateway)


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        yield session
