"""Checks behind the security settings: secrets read from files, TLS certificate/key pairs, and
refusing to expose an unauthenticated admin API beyond this machine.

Kept apart from ``gateway.settings.schema`` so that module stays a list of fields; these run
inside its validators, so a mistake ends ``iotgw serve`` with "invalid settings" before
anything starts.
"""

from __future__ import annotations

import ipaddress
import ssl
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, SecretStr


def read_secret_file(path: Path, *, setting: str) -> SecretStr:
    """The secret in ``path`` without its trailing newline (what ``echo`` and editors leave)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ValueError(f"{setting}: cannot read secret file {path}: {why}") from None
    secret = text.rstrip("\r\n")
    if not secret:
        raise ValueError(f"{setting}: secret file {path} is empty")
    return SecretStr(secret)


def resolve_secret_files(settings: BaseModel, names: Iterable[str], *, section: str) -> None:
    """For each secret ``name`` with a ``<name>_file`` field: read the file into ``name``.

    The file field is cleared once read, so validating the resolved settings again (as
    ``GatewaySettings.load`` does) sees one source, not two.
    """
    for name in names:
        file_field = f"{name}_file"
        path = getattr(settings, file_field)
        if path is None:
            continue
        if getattr(settings, name) is not None:
            raise ValueError(
                f"{section}.{name} and {section}.{file_field} are both set; give one of them"
            )
        setattr(settings, name, read_secret_file(path, setting=f"{section}.{file_field}"))
        setattr(settings, file_field, None)


def check_tls_pair(cert_file: Path | None, key_file: Path | None) -> None:
    if (cert_file is None) != (key_file is None):
        given, missing = (
            ("tls_cert_file", "tls_key_file")
            if cert_file is not None
            else ("tls_key_file", "tls_cert_file")
        )
        raise ValueError(
            f"http.{given} is set but http.{missing} is not: HTTPS needs both the certificate "
            "chain and its private key"
        )
    if cert_file is not None and key_file is not None:
        try:
            tls_server_context(cert_file, key_file)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(
                f"http.tls_cert_file {cert_file} / http.tls_key_file {key_file}: cannot load "
                f"them as a certificate chain and its key: {exc}"
            ) from None


def tls_server_context(cert_file: Path, key_file: Path) -> ssl.SSLContext:
    """A server context for HTTPS: TLS 1.2 or newer, Python's default ciphers."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    return context


def is_loopback_host(host: str) -> bool:
    """True when a listener on ``host`` is reachable from this machine only. Host names other
    than ``localhost`` are not resolved: they count as reachable from elsewhere."""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def check_admin_exposure(host: str, *, admin_token_set: bool, allowed: bool) -> None:
    """Refuse to serve /admin (knobs, tuner) without a token on an address other machines reach,
    unless the operator said so explicitly."""
    if admin_token_set or allowed or is_loopback_host(host):
        return
    raise ValueError(
        f"http.host {host!r} is reachable from other machines and the /admin endpoints "
        "(which change knobs and the tuner) have no token: set one with "
        "IOTGW_HTTP__ADMIN_TOKEN_FILE or --admin-token-file, or listen on 127.0.0.1; to run "
        "without one anyway, set http.allow_unauthenticated_admin "
        "(--allow-unauthenticated-admin)"
    )
