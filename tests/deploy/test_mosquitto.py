"""deploy/mosquitto's configuration and ACL, as shipped, loaded by a real Mosquitto the two ways
they are installed: as a conf.d file under Debian's own /etc/mosquitto/mosquitto.conf
(deploy/mosquitto/README.md) and under ./broker.conf, the compose stack's main configuration.
Only the values that name this machine's ports and files are replaced (listener, password file,
ACL, store, include folder, pid file, log). Mosquitto refuses to start on a configuration
variable or an ACL line it does not know, or on a value set twice across the files, so a broker
that listens has accepted every line. What the ACL enforces between devices is tested against a
running broker in tests/gateway/test_mqtt_trust.py."""

from __future__ import annotations

import getpass
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.brokers import free_port, mosquitto_binary
from tests.deploy.conftest import DEPLOY

SNIPPET = DEPLOY / "mosquitto" / "mosquitto.conf"
ACL = DEPLOY / "mosquitto" / "acl"
COMPOSE_MAIN = DEPLOY / "mosquitto" / "broker.conf"
# Installed with Debian's mosquitto package (the test command installs it).
DEBIAN_MAIN = Path("/etc/mosquitto/mosquitto.conf")


def localise(conf: str, local: dict[str, str]) -> str:
    """``conf`` with this machine's values for the keys in ``local``."""
    lines = []
    for line in conf.splitlines():
        key = line.split()[0] if line.strip() and not line.startswith("#") else ""
        lines.append(f"{key} {local[key]}" if key in local else line)
    return "\n".join(lines) + "\n"


def install(folder: Path, main: str, snippet: str, acl: Path, port: int) -> Path:
    """A main configuration with the snippet in its include folder, as on the target."""
    (folder / "conf.d").mkdir()
    (folder / "iotgw.passwd").touch()
    local = {
        "listener": f"{port} 127.0.0.1",
        "password_file": str(folder / "iotgw.passwd"),
        "acl_file": str(acl),
        "persistence_location": f"{folder}/",
        "include_dir": str(folder / "conf.d"),
        "pid_file": str(folder / "mosquitto.pid"),
        "log_dest": "stderr",
    }
    (folder / "conf.d" / "iotgw.conf").write_text(localise(snippet, local))
    # Started as root, Mosquitto would drop to user "mosquitto", who cannot read tmp_path.
    path = folder / "mosquitto.conf"
    path.write_text(localise(main, local) + f"user {getpass.getuser()}\n")
    return path


def start(config: Path, port: int) -> tuple[bool, str]:
    """Whether Mosquitto came up listening with this configuration, and its log (it is
    stopped again either way)."""
    proc = subprocess.Popen(
        [mosquitto_binary(), "-c", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    listening = False
    deadline = time.monotonic() + 10
    while not listening and proc.poll() is None and time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                listening = True
        except OSError:
            time.sleep(0.05)
    if proc.poll() is None:
        proc.terminate()
    try:
        log, _ = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        log, _ = proc.communicate()
    return listening, log


def load(folder: Path, main: str, snippet: str, acl: Path = ACL) -> tuple[bool, str]:
    port = free_port()
    return start(install(folder, main, snippet, acl, port), port)


@pytest.mark.parametrize("main", [DEBIAN_MAIN, COMPOSE_MAIN], ids=["debian", "compose"])
def test_shipped_configuration_and_acl_start_a_broker(tmp_path: Path, main: Path) -> None:
    assert main.exists(), f"{main} is missing: Debian's mosquitto package installs it"
    listening, log = load(tmp_path, main.read_text(), SNIPPET.read_text())
    assert listening, log
    assert "Error" not in log, log


def test_mosquitto_rejects_a_misspelt_configuration_variable(tmp_path: Path) -> None:
    snippet = SNIPPET.read_text().replace("max_inflight_messages", "max_inflight_mesages")
    listening, log = load(tmp_path, COMPOSE_MAIN.read_text(), snippet)
    assert not listening
    assert 'Unknown configuration variable "max_inflight_mesages"' in log, log


def test_mosquitto_rejects_a_value_set_twice(tmp_path: Path) -> None:
    """Why the shipped file leaves the store's location to the main configuration."""
    snippet = SNIPPET.read_text() + "persistence_location /var/lib/mosquitto/\n"
    listening, log = load(tmp_path, COMPOSE_MAIN.read_text(), snippet)
    assert not listening
    assert "Duplicate persistence_location value" in log, log


def test_mosquitto_rejects_a_misspelt_acl_line(tmp_path: Path) -> None:
    acl = tmp_path / "acl"
    acl.write_text(ACL.read_text().replace("pattern write", "patern write"))
    listening, log = load(tmp_path, COMPOSE_MAIN.read_text(), SNIPPET.read_text(), acl)
    assert not listening
    assert "Invalid line in acl_file" in log, log
