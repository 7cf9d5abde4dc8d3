"""The amqtt embedded broker reads the hashes ``mosquitto_passwd`` writes, so one password file
serves whichever embedded broker runs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from gateway.brokers.amqtt_auth import MosquittoPbkdf2Hasher


def test_a_hash_it_writes_verifies_and_a_wrong_password_does_not() -> None:
    hasher = MosquittoPbkdf2Hasher()
    hashed = hasher.hash("s3cret")
    assert MosquittoPbkdf2Hasher.identify(hashed)
    assert hasher.verify("s3cret", hashed)
    assert not hasher.verify("s3cret!", hashed)
    assert not hasher.verify("s3cret", "$7$101$not-base64$")


def test_a_hash_written_by_mosquitto_passwd_verifies(tmp_path: Path) -> None:
    binary = shutil.which("mosquitto_passwd") or "/usr/bin/mosquitto_passwd"
    if not Path(binary).exists():
        pytest.fail("mosquitto_passwd is missing: the test command installs mosquitto")
    passwords = tmp_path / "passwd"
    subprocess.run([binary, "-c", "-b", str(passwords), "dev1", "pa55"], check=True)
    (line,) = passwords.read_text().splitlines()
    user, hashed = line.split(":", 1)
    assert user == "dev1"
    assert MosquittoPbkdf2Hasher().verify("pa55", hashed)
    assert not MosquittoPbkdf2Hasher().verify("pa56", hashed)
