"""The embedded Mosquitto's folder (gateway/brokers/mosquitto.py): one per listener port under the
cache directory, locked while its broker runs, so a second gateway can neither rewrite a
running broker's configuration nor share its store; a random port's folder goes at stop; the
store of the single folder of earlier versions moves to its port's folder. Real Mosquitto
processes, started through the embedded-broker layer; tests/gateway/test_embedded_mosquitto.py
runs two whole gateways on one machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.brokers.mosquitto import MosquittoBroker, broker_dir
from gateway.lifecycle import StartupError
from tests.brokers import free_port, mosquitto_binary

pytestmark = pytest.mark.asyncio(loop_scope="session")


def _broker(cache: Path, port: int, *, ephemeral: bool = False) -> MosquittoBroker:
    return MosquittoBroker(
        binary=mosquitto_binary(), port=port, data_dir=broker_dir(cache, port), ephemeral=ephemeral
    )


async def test_a_second_broker_on_a_running_brokers_folder_is_refused_untouched(
    tmp_path: Path,
) -> None:
    port = free_port()
    first = _broker(tmp_path, port)
    await first.start()
    try:
        config = first.data_dir / "mosquitto.conf"
        before = (config.read_bytes(), config.stat().st_mtime_ns)
        # As a second gateway started at the same moment on the same port and cache would:
        # its port check passed before the first bound it.
        second = MosquittoBroker(binary=mosquitto_binary(), port=port + 1, data_dir=first.data_dir)
        with pytest.raises(StartupError, match=r"in use by another gateway \(pid \d+\)"):
            await second.start()
        assert (config.read_bytes(), config.stat().st_mtime_ns) == before
        assert f"listener {port} " in config.read_text()
        assert first.pid is not None and second.pid is None
    finally:
        await first.stop()
    again = _broker(tmp_path, port)  # released at stop: the next start takes it
    await again.start()
    await again.stop()


async def test_two_ports_two_folders(tmp_path: Path) -> None:
    a, b = _broker(tmp_path, free_port()), _broker(tmp_path, free_port())
    await a.start()
    await b.start()
    try:
        assert a.data_dir != b.data_dir
        assert f"listener {a.port} " in (a.data_dir / "mosquitto.conf").read_text()
        assert f"listener {b.port} " in (b.data_dir / "mosquitto.conf").read_text()
        assert f"persistence_location {a.data_dir}/" in (a.data_dir / "mosquitto.conf").read_text()
    finally:
        await a.stop()
        await b.stop()


async def test_a_random_ports_folder_goes_at_stop(tmp_path: Path) -> None:
    broker = _broker(tmp_path, free_port(), ephemeral=True)
    await broker.start()
    assert (broker.data_dir / "mosquitto.conf").is_file()
    await broker.stop()
    assert not broker.data_dir.exists()


async def test_the_store_of_the_single_folder_moves_to_its_ports_folder(tmp_path: Path) -> None:
    port = free_port()
    legacy = tmp_path / "mosquitto"
    legacy.mkdir()
    (legacy / "mosquitto.conf").write_text(f"listener {port} 127.0.0.1\npersistence true\n")
    (legacy / "mosquitto.db").write_bytes(b"")  # mosquitto reads an empty store as none
    other = _broker(tmp_path, free_port())  # another port's broker leaves it alone
    await other.start()
    await other.stop()
    assert (legacy / "mosquitto.db").is_file()
    broker = _broker(tmp_path, port)
    await broker.start()
    await broker.stop()
    assert not (legacy / "mosquitto.db").exists() and not (legacy / "mosquitto.conf").exists()
    assert (broker.data_dir / "mosquitto.db").exists()
