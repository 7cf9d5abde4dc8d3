"""deploy/mosquitto/mosquitto.conf and its ACL, as shipped, loaded by a real Mosquitto: only
the values that name this machine's port and files are replaced (listener, password file, ACL
path, store). Mosquitto refuses to start on a configuration variable or an ACL line it does not
know, so a broker that listens has accepted every line of both. What the ACL enforces between
devices is tested against a running broker in tests/gateway/test_mqtt_trust.py."""

from __future__ import annotations

import getpass
import socket
import subprocess
import time
from pathlib import Path

from tests.brokers import free_port, mosquitto_binary
from tests.deploy.conftest import DEPLOY

CONF = DEPLOY / "mosquitto" / "mosquitto.conf"
ACL = DEPLOY / "mosquitto" / "acl"


def local_config(folder: Path, conf: str, acl: Path, port: int) -> Path:
    """``conf`` with this machine's values for the lines that name ports and files."""
    password_file = folder / "iotgw.passwd"
    password_file.touch()
    local = {
        "listener": f"{port} 127.0.0.1",
        "password_file": str(password_file),
        "acl_file": str(acl),
        "persistence_location": f"{folder}/",
    }
    lines = []
    for line in conf.splitlines():
        key = line.split()[0] if line.strip() and not line.startswith("#") else ""
        lines.append(f"{key} {local[key]}" if key in local else line)
    # Started as root, Mosquitto would drop to user "mosquitto", who cannot read tmp_path.
    lines.append(f"user {getpass.getuser()}")
    path = folder / "mosquitto.conf"
    path.write_text("\n".join(lines) + "\n")
    return path


def start(folder: Path, conf: str, acl: Path) -> tuple[bool, str]:
    """Whether Mosquitto came up listening with this configuration, and its log (it is
    stopped again either way)."""
    port = free_port()
    config = local_config(folder, conf, acl, port)
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


def test_shipped_configuration_and_acl_start_a_broker(tmp_path: Path) -> None:
    listening, log = start(tmp_path, CONF.read_text(), ACL)
    assert listening, log
    assert "Error" not in log, log


def test_mosquitto_rejects_a_misspelt_configuration_variable(tmp_path: Path) -> None:
    conf = CONF.read_text().replace("max_inflight_messages", "max_inflight_mesages")
    listening, log = start(tmp_path, conf, ACL)
    assert not listening
    assert 'Unknown configuration variable "max_inflight_mesages"' in log, log


def test_mosquitto_rejects_a_misspelt_acl_line(tmp_path: Path) -> None:
    acl = tmp_path / "acl"
    acl.write_text(ACL.read_text().replace("pattern write", "patern write"))
    listening, log = start(tmp_path, CONF.read_text(), acl)
    assert not listening
    assert "Invalid line in acl_file" in log, log
