"""Closed-loop HTTP load from wrk (Debian's package, a C load generator): N connections, each
sending its next request as soon as the last is answered, the same JSON body every time.

wrk costs the shared cores far less per request than a Python client, so at the gateway's
highest rates the client is not what is measured. Its own latency histogram gives the
percentiles; a Lua ``done`` hook prints them as one JSON line, with the errors by kind and the
replies that were not 2xx (counted as failed, never as served).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_SCRIPT = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = assert(io.open(os.getenv("IOTGW_WRK_BODY"), "rb"))
wrk.body = f:read("*a")
f:close()

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '\\nIOTGW_WRK {"requests": %d, "duration_us": %d, "non_2xx": %d, "connect": %d, ' ..
    '"read": %d, "write": %d, "timeout": %d, "p50_us": %d, "p90_us": %d, "p99_us": %d, ' ..
    '"max_us": %d, "mean_us": %.1f}\\n',
    summary.requests, summary.duration, e.status, e.connect, e.read, e.write, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max,
    latency.mean))
end
"""


@dataclass(frozen=True, slots=True)
class WrkResult:
    connections: int
    seconds: float
    requests: int
    failed: int
    """Replies that were not 2xx, and socket errors (connect, read, write, timeout)."""
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    lost: int = 0
    """Of ``failed``, the socket errors: requests that got no answer at all (the rest were
    answered, with a refusal and its reason)."""

    @property
    def rate_per_s(self) -> float:
        """Requests answered 2xx per second."""
        return (self.requests - self.failed) / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "connections": self.connections,
            "seconds": round(self.seconds, 3),
            "requests": self.requests,
            "failed": self.failed,
            "lost": self.lost,
            "rate_per_s": round(self.rate_per_s, 1),
            "p50_ms": round(self.p50_ms, 3),
            "p90_ms": round(self.p90_ms, 3),
            "p99_ms": round(self.p99_ms, 3),
            "max_ms": round(self.max_ms, 3),
        }


def ensure_wrk() -> str:
    """The wrk binary, installed from Debian's packages when missing (as root, or with sudo)."""
    return ensure_debian_binary("wrk", "wrk")


def ensure_debian_binary(binary: str, package: str) -> str:
    """``binary``'s path, installing Debian's ``package`` when it is missing (as root, or with
    sudo; the package index is refreshed only when the first try fails)."""
    found = shutil.which(binary)
    if found is not None:
        return found
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    install = [*sudo, "apt-get", "install", "-y", "-q", package]
    if subprocess.run(install, capture_output=True, check=False).returncode != 0:
        subprocess.run([*sudo, "apt-get", "update", "-q"], capture_output=True, check=True)
        subprocess.run(install, capture_output=True, check=True)
    found = shutil.which(binary)
    if found is None:
        raise RuntimeError(f"{binary} is not installed and apt-get could not install {package}")
    return found
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    install = [*sudo, "apt-get", "install", "-y", "-q", "wrk"]
    if subprocess.run(install, capture_output=True, check=False).returncode != 0:
        subprocess.run([*sudo, "apt-get", "update", "-q"], capture_output=True, check=True)
        subprocess.run(install, capture_output=True, check=True)
    found = shutil.which("wrk")
    if found is None:
        raise RuntimeError("wrk is not installed and apt-get could not install it")
    return found


def run_wrk(
    url: str, body: bytes, *, connections: int, seconds: float, timeout_s: float = 10.0
) -> WrkResult:
    """``connections`` closed-loop clients POSTing ``body`` to ``url`` for ``seconds`` (one
    thread: the gateway needs the other core more than wrk does)."""
    wrk = ensure_wrk()
    with tempfile.TemporaryDirectory(prefix="iotgw-wrk-") as tmp:
        script, body_file = Path(tmp) / "post.lua", Path(tmp) / "body.json"
        script.write_text(_SCRIPT, encoding="utf-8")
        body_file.write_bytes(body)
        argv = [
            wrk,
            "-t1",
            f"-c{connections}",
            f"-d{max(1, round(seconds))}s",
            f"--timeout={max(1, round(timeout_s))}s",
            "-s",
            str(script),
            url,
        ]
        env = {**os.environ, "IOTGW_WRK_BODY": str(body_file)}
        done = subprocess.run(
            argv, capture_output=True, text=True, env=env, timeout=seconds + timeout_s + 30
        )
    return parse_wrk(done.stdout, connections, done.stderr)


def parse_wrk(stdout: str, connections: int, stderr: str = "") -> WrkResult:
    """The figures of the ``done`` hook's line in wrk's output."""
    line = next((ln for ln in stdout.splitlines() if ln.startswith("IOTGW_WRK ")), None)
    if line is None:
        raise RuntimeError(f"wrk printed no figures:\n{stdout[-2000:]}\n{stderr[-2000:]}")
    doc = json.loads(line.removeprefix("IOTGW_WRK "))
    lost = sum(int(doc[k]) for k in ("connect", "read", "write", "timeout"))
    failed = int(doc["non_2xx"]) + lost
    return WrkResult(
        connections=connections,
        seconds=doc["duration_us"] / 1e6,
        requests=int(doc["requests"]),
        failed=failed,
        p50_ms=doc["p50_us"] / 1000.0,
        p90_ms=doc["p90_us"] / 1000.0,
        p99_ms=doc["p99_us"] / 1000.0,
        max_ms=doc["max_us"] / 1000.0,
        lost=lost,
    )
