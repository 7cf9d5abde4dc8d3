"""Password-file authentication for the amqtt embedded broker that also reads the hashes
``mosquitto_passwd`` writes, so one password file serves whichever embedded broker runs.

Loaded by amqtt from its configuration by dotted path
(``gateway.brokers.amqtt_auth.PasswordFilePlugin``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os

from amqtt.plugins.authentication import FileAuthPlugin
from pwdlib import PasswordHash
from pwdlib.hashers.base import ensure_str

_PBKDF2_PREFIX = "$7$"


class MosquittoPbkdf2Hasher:
    """mosquitto 2's ``$7$<iterations>$<salt>$<digest>``: PBKDF2-HMAC-SHA512, base64 fields."""

    @classmethod
    def identify(cls, hash: str | bytes) -> bool:
        return ensure_str(hash).startswith(_PBKDF2_PREFIX)

    def hash(self, password: str | bytes, *, salt: bytes | None = None) -> str:
        """A hash as ``mosquitto_passwd`` writes it (101 iterations, 12-byte salt)."""
        salt = os.urandom(12) if salt is None else salt
        digest = hashlib.pbkdf2_hmac(
            "sha512", password.encode() if isinstance(password, str) else password, salt, 101
        )
        b64 = base64.b64encode
        return f"{_PBKDF2_PREFIX}101${b64(salt).decode()}${b64(digest).decode()}"

    def verify(self, password: str | bytes, hash: str | bytes) -> bool:
        try:
            _, _, iterations, salt, digest = ensure_str(hash).split("$")
            want = base64.b64decode(digest, validate=True)
            got = hashlib.pbkdf2_hmac(
                "sha512",
                password.encode() if isinstance(password, str) else password,
                base64.b64decode(salt, validate=True),
                int(iterations),
                dklen=len(want),
            )
        except (ValueError, binascii.Error):
            return False
        return hmac.compare_digest(got, want)

    def check_needs_rehash(self, hash: str | bytes) -> bool:
        return False


class PasswordFilePlugin(FileAuthPlugin):
    """amqtt's file authentication plugin (argon2, bcrypt, sha512-crypt lines) that also
    verifies mosquitto_passwd's lines."""

    pwd_hasher: PasswordHash

    def __init__(self, context: object) -> None:
        super().__init__(context)
        self.pwd_hasher = PasswordHash((MosquittoPbkdf2Hasher(), *self.pwd_hasher.hashers))
