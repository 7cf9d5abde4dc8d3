"""HTTP security and bounds: HTTPS, bearer tokens per endpoint group, secrets read from files,
refusing an open admin API beyond loopback, the connection cap, and the deadlines for request
bodies and idle connections."""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import numpy as np
import pytest
import trustme
from pydantic import ValidationError

from gateway.main import Gateway
from gateway.settings.schema import GatewaySettings
from gateway.settings.security import is_loopback_host
from tests.brokers import free_port
from tests.gateway.certificates import server_certificate
from tests.gateway.helpers import (
    base_url,
    infer_binary,
    make_repo,
    metric_samples,
    running_gateway,
)
from tests.gateway.serve_process import serve, serve_command

# Only the async tests run on the session's loop (that of the shared ``http`` session).
on_session_loop = pytest.mark.asyncio(loop_scope="session")

FEATURES = {"features": np.zeros((1, 32), dtype=np.float32)}
ADMIN, INFERENCE, METRICS = "admin-0123", "inference-4567", "metrics-89ab"
DEADLINE_S = 30.0  # for a reply or a close that must come; never reached when things work


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def repo(demo_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repo(tmp_path_factory.mktemp("security") / "repo", demo_repo, {"sensor_mlp": None})


@pytest.fixture
def no_gateway_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings tests see only what they set (a developer's IOTGW_HTTP__* would leak in)."""
    for name in list(os.environ):
        if name.startswith(("IOTGW_HTTP__", "IOTGW_MQTT__")):
            monkeypatch.delenv(name)


def refusals(metrics_text: str, reason: str) -> float:
    return sum(
        value
        for name, labels, value in metric_samples(metrics_text)
        if name == "iotgw_error_replies_total" and labels == {"transport": "http", "reason": reason}
    )


# -- raw HTTP/1.1, for what a well-behaved client library will not do -------------------------


async def raw_connection(gw: Gateway) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", gw.http_port)


async def raw_get(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str
) -> tuple[str, dict[str, str], bytes]:
    """One keep-alive GET; returns (status line, headers in lower case, body)."""
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), DEADLINE_S)
    status, *lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines if ln)}
    body = await reader.readexactly(int(headers["content-length"]))
    return status, headers, body


async def closed_by_server(reader: asyncio.StreamReader) -> bytes:
    """Everything the server still sends, up to its closing the connection."""
    return await asyncio.wait_for(reader.read(), DEADLINE_S)


# -- HTTPS --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[trustme.CA, Path, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1, as PEM files."""
    return server_certificate(tmp_path_factory.mktemp("tls"))


@on_session_loop
async def test_https_serves_inference_and_plain_http_is_refused(
    repo: Path, tmp_path: Path, tls: tuple[trustme.CA, Path, Path]
) -> None:
    ca, cert_file, key_file = tls
    client_context = ssl.create_default_context()
    ca.configure_trust(client_context)
    async with (
        running_gateway(repo, tmp_path, tls_cert_file=cert_file, tls_key_file=key_file) as gw,
        aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=client_context),
            timeout=aiohttp.ClientTimeout(total=DEADLINE_S),
        ) as https,
    ):
        url = f"https://127.0.0.1:{gw.http_port}"
        status, outputs, _ = await infer_binary(https, url, "sensor_mlp", FEATURES)
        assert status == 200, outputs
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", gw.http_port, ssl=client_context, server_hostname="127.0.0.1"
        )
        assert writer.get_extra_info("ssl_object").version() in {"TLSv1.2", "TLSv1.3"}
        status_line, _, _ = await raw_get(reader, writer, "/v2/health/ready")
        assert status_line == "HTTP/1.1 200 OK"
        writer.close()

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=DEADLINE_S)) as plain:
            with pytest.raises(aiohttp.ClientError):
                async with plain.get(f"{base_url(gw)}/v2/health/live") as r:
                    await r.read()


def test_tls_needs_both_files_and_a_matching_pair(
    tls: tuple[trustme.CA, Path, Path], tmp_path: Path, no_gateway_env: None
) -> None:
    _, cert_file, key_file = tls
    with pytest.raises(ValidationError, match="tls_key_file is not"):
        GatewaySettings.load(http={"tls_cert_file": cert_file})
    with pytest.raises(ValidationError, match="tls_cert_file is not"):
        GatewaySettings.load(http={"tls_key_file": key_file})
    other_key = trustme.CA().issue_cert("127.0.0.1").private_key_pem
    other_key.write_to_path(str(tmp_path / "other.key"))
    with pytest.raises(ValidationError, match="cannot load them"):
        GatewaySettings.load(
            http={"tls_cert_file": cert_file, "tls_key_file": tmp_path / "other.key"}
        )


# -- tokens -------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def guarded_gateway(repo: Path, cache: Path) -> AsyncIterator[Gateway]:
    async with running_gateway(
        repo, cache, admin_token=ADMIN, inference_token=INFERENCE, metrics_token=METRICS
    ) as gw:
        yield gw


INFERENCE_ROUTES = [
    ("GET", "/v2/models/sensor_mlp"),
    ("GET", "/v2/models/sensor_mlp/versions/1/ready"),
    ("GET", "/v2/models/sensor_mlp/config"),
    ("POST", "/v2/repository/index"),
    ("GET", "/v1/models/sensor_mlp"),
    ("GET", "/v1/models/sensor_mlp/metadata"),
]


@on_session_loop
async def test_tokens_guard_their_own_endpoints_only(
    repo: Path, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with guarded_gateway(repo, tmp_path) as gw:
        url = base_url(gw)
        for method, path in INFERENCE_ROUTES:
            for headers in ({}, bearer("wrong"), bearer(ADMIN), bearer(METRICS)):
                async with http.request(method, url + path, headers=headers) as r:
                    assert r.status == 401, (method, path, headers)
                    assert "Bearer <inference token>" in (await r.json())["error"]
                    assert r.headers["WWW-Authenticate"].startswith("Bearer ")
            async with http.request(method, url + path, headers=bearer(INFERENCE)) as r:
                assert r.status == 200, (method, path, await r.text())

        status, error, reply_headers = await infer_binary(http, url, "sensor_mlp", FEATURES)
        assert status == 401 and "inference token" in str(error)
        assert 'error="invalid_token"' not in reply_headers["WWW-Authenticate"]  # none given
        async with http.post(
            f"{url}/v2/models/sensor_mlp/infer", data=b"{}", headers=bearer("nope")
        ) as r:
            assert r.status == 401
            assert "wrong token" in (await r.json())["error"]
            assert 'error="invalid_token"' in r.headers["WWW-Authenticate"]

        for headers in ({}, bearer(INFERENCE), bearer(ADMIN)):
            async with http.get(f"{url}/metrics", headers=headers) as r:
                assert r.status == 401
                assert "Bearer <metrics token>" in (await r.json())["error"]
        for headers in ({}, bearer(INFERENCE), bearer(METRICS)):
            async with http.get(f"{url}/admin/models", headers=headers) as r:
                assert r.status == 401
        async with http.get(f"{url}/admin/models", headers=bearer(ADMIN)) as r:
            assert r.status == 200

        for path in ("/v2", "/v2/health/live", "/v2/health/ready"):
            async with http.get(url + path) as r:
                assert r.status == 200, path

        async with http.get(f"{url}/metrics", headers=bearer(METRICS)) as r:
            assert r.status == 200
            text = await r.text()
        assert refusals(text, "unauthorized_inference") == 4 * len(INFERENCE_ROUTES) + 2
        assert refusals(text, "unauthorized_metrics") == 3
        assert refusals(text, "unauthorized_admin") == 3


@on_session_loop
async def test_an_authorized_infer_computes(
    repo: Path, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with (
        guarded_gateway(repo, tmp_path) as gw,
        aiohttp.ClientSession(headers=bearer(INFERENCE)) as device,
    ):
        status, outputs, _ = await infer_binary(device, base_url(gw), "sensor_mlp", FEATURES)
        assert status == 200, outputs
        assert isinstance(outputs, dict) and outputs


# -- secrets from files -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("section", "field", "env"),
    [
        ("http", "admin_token", "IOTGW_HTTP__ADMIN_TOKEN_FILE"),
        ("http", "inference_token", "IOTGW_HTTP__INFERENCE_TOKEN_FILE"),
        ("http", "metrics_token", "IOTGW_HTTP__METRICS_TOKEN_FILE"),
        ("mqtt", "password", "IOTGW_MQTT__PASSWORD_FILE"),
    ],
)
def test_every_secret_reads_from_a_file(
    section: str,
    field: str,
    env: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    no_gateway_env: None,
) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s3cret value\r\n")
    monkeypatch.setenv(env, str(secret))
    loaded = getattr(GatewaySettings.load(), section)
    assert getattr(loaded, field).get_secret_value() == "s3cret value"
    assert "s3cret" not in repr(loaded)

    with pytest.raises(ValidationError, match=f"{section}.{field} and {section}.{field}_file"):
        GatewaySettings.load(None, **{section: {field: "also given"}})

    secret.unlink()
    with pytest.raises(ValidationError, match=f"cannot read secret file {secret}"):
        GatewaySettings.load()
    secret.write_text("\n")
    with pytest.raises(ValidationError, match="is empty"):
        GatewaySettings.load()


@contextlib.contextmanager
def serve_process(
    repo: Path, folder: Path, *flags: str, env: dict[str, str] | None = None
) -> Iterator[str]:
    """``iotgw serve`` (HTTP only) until ready; yields its URL."""
    with serve(repo, folder, "--no-mqtt", *flags, env=env) as gateway:
        gateway.wait_ready()
        yield gateway.url


@pytest.mark.slow
@on_session_loop
async def test_serve_reads_tokens_from_a_flag_file_and_env_files(
    repo: Path, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    files = {}
    for name, token in (("admin", ADMIN), ("inference", INFERENCE), ("metrics", METRICS)):
        files[name] = tmp_path / f"{name}.token"
        files[name].write_text(token + "\n")
    env = {
        "IOTGW_HTTP__INFERENCE_TOKEN_FILE": str(files["inference"]),
        "IOTGW_HTTP__METRICS_TOKEN_FILE": str(files["metrics"]),
    }
    flags = ("--admin-token-file", str(files["admin"]))
    with serve_process(repo, tmp_path, *flags, env=env) as url:
        for path, token in (
            ("/admin/models", ADMIN),
            ("/v2/models/sensor_mlp", INFERENCE),
            ("/metrics", METRICS),
        ):
            async with http.get(url + path) as r:
                assert r.status == 401, path
            async with http.get(url + path, headers=bearer(token)) as r:
                assert r.status == 200, path
        async with aiohttp.ClientSession(headers=bearer(INFERENCE)) as device:
            status, outputs, _ = await infer_binary(device, url, "sensor_mlp", FEATURES)
        assert status == 200, outputs


# -- binding beyond loopback --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.3.2.1", True),
        ("::1", True),
        ("localhost", True),
        ("::ffff:127.0.0.1", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.168.1.20", False),
        ("", False),
        ("gateway.example", False),
    ],
)
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback


def test_an_open_admin_beyond_loopback_needs_a_token_or_an_explicit_allowance(
    repo: Path, tmp_path: Path, no_gateway_env: None
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IOTGW_HTTP__")}
    refused = subprocess.run(
        serve_command(repo, tmp_path, free_port(), "--no-mqtt", "--host", "0.0.0.0"),
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert refused.returncode == 2, refused.stderr
    for words in ("'0.0.0.0'", "no token", "--admin-token-file", "--allow-unauthenticated-admin"):
        assert words in refused.stderr

    # Accepted, with no socket opened on other interfaces by a test: the settings that
    # `iotgw serve` would start with.
    allowed = GatewaySettings.load(http={"host": "0.0.0.0", "allow_unauthenticated_admin": True})
    assert allowed.http.host == "0.0.0.0"
    assert GatewaySettings.load(http={"host": "::", "admin_token": ADMIN}).http.host == "::"


def test_the_container_image_allows_the_open_admin_explicitly() -> None:
    dockerfile = (Path(__file__).parents[2] / "Dockerfile").read_text()
    assert "IOTGW_HTTP__HOST=0.0.0.0" in dockerfile
    assert "IOTGW_HTTP__ALLOW_UNAUTHENTICATED_ADMIN=true" in dockerfile


# -- connection cap -----------------------------------------------------------------------------


@on_session_loop
async def test_connections_beyond_the_cap_get_503_and_are_served_once_others_close(
    repo: Path, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    cap = 4
    async with running_gateway(repo, tmp_path, max_connections=cap) as gw:
        idle = [await raw_connection(gw) for _ in range(cap)]
        for reader, writer in idle:  # one request each, then they sit idle (keep-alive)
            status, _, _ = await raw_get(reader, writer, "/v2/health/live")
            assert status == "HTTP/1.1 200 OK"

        reader, writer = await raw_connection(gw)
        status, headers, body = await raw_get(reader, writer, "/v2/models/sensor_mlp/ready")
        assert status.startswith("HTTP/1.1 503")
        assert "too many connections" in body.decode()
        assert headers["connection"] == "close" and headers["retry-after"] == "1"
        assert await closed_by_server(reader) == b""
        writer.close()

        # A liveness probe on a connection beyond the cap is answered, then closed.
        reader, writer = await raw_connection(gw)
        status, headers, _ = await raw_get(reader, writer, "/v2/health/live")
        assert status == "HTTP/1.1 200 OK" and headers["connection"] == "close"
        assert await closed_by_server(reader) == b""
        writer.close()

        # The admitted connections are still served.
        status, _, _ = await raw_get(*idle[0], "/v2/models/sensor_mlp/ready")
        assert status == "HTTP/1.1 200 OK"

        for _, writer in idle:
            writer.close()
            await writer.wait_closed()
        deadline = time.monotonic() + DEADLINE_S
        while True:  # until the server has seen them close (in this very loop, soon)
            async with http.get(f"{base_url(gw)}/v2/models/sensor_mlp/ready") as r:
                if r.status == 200:
                    break
                assert r.status == 503 and time.monotonic() < deadline
        code, outputs, _ = await infer_binary(http, base_url(gw), "sensor_mlp", FEATURES)
        assert code == 200, outputs
        async with http.get(f"{base_url(gw)}/metrics") as r:
            assert refusals(await r.text(), "connection_limit") >= 1


# -- deadlines ----------------------------------------------------------------------------------


@on_session_loop
async def test_a_body_that_stalls_gets_408_and_others_are_served_meanwhile(
    repo: Path, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with running_gateway(repo, tmp_path, read_timeout_s=2.0) as gw:
        reader, writer = await raw_connection(gw)
        writer.write(
            b"POST /v2/models/sensor_mlp/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n" + b" " * 500
        )
        await writer.drain()

        status, outputs, _ = await infer_binary(http, base_url(gw), "sensor_mlp", FEATURES)
        assert status == 200, outputs

        reply = await closed_by_server(reader)  # the 408, then the server closes
        assert reply.startswith(b"HTTP/1.1 408 ")
        assert b"did not arrive within 2 s" in reply
        assert b"Connection: close" in reply
        writer.close()
        async with http.get(f"{base_url(gw)}/metrics") as r:
            assert refusals(await r.text(), "read_timeout") == 1


@on_session_loop
async def test_idle_and_half_sent_connections_are_closed(repo: Path, tmp_path: Path) -> None:
    async with running_gateway(repo, tmp_path, keepalive_timeout_s=1.0) as gw:
        idle_reader, idle_writer = await raw_connection(gw)
        status, _, _ = await raw_get(idle_reader, idle_writer, "/v2/health/live")
        assert status == "HTTP/1.1 200 OK"
        half_reader, half_writer = await raw_connection(gw)
        half_writer.write(b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0")  # and nothing more
        silent_reader, silent_writer = await raw_connection(gw)

        assert await closed_by_server(idle_reader) == b""
        assert await closed_by_server(half_reader) == b""
        assert await closed_by_server(silent_reader) == b""
        for writer in (idle_writer, half_writer, silent_writer):
            writer.close()
