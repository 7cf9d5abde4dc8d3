"""Closed-loop gRPC load from h2load (Debian's ``nghttp2-client``, a C HTTP/2 load generator):
N calls in flight over a few HTTP/2 connections, each call sending its next request as soon as
the last is answered, the same serialized gRPC message every time.

A Python gRPC client spends more of the shared cores per call than the servers it measures
(``iotgw bench grpc``'s own loop tops out near 700 calls a second), so the peers benchmark
drives gRPC, as it drives HTTP with wrk, from C. A gRPC call is an HTTP/2 POST of the
length-prefixed message with ``content-type: application/grpc``; h2load sends that body as it
is. It cannot read a gRPC status (a trailer, behind HTTP status 200), so a call it counts as
answered is only answered: the caller checks the server's own count of successful inferences
over the same run (``Served``).

Latency percentiles come from h2load's per-request log (``--log-file``), rate from its count of
calls done over its own measured time.
"""

from __future__ import annotations

import re
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.wrk import ensure_debian_binary

HEADERS = ("content-type: application/grpc", "te: trailers")
_FINISHED = re.compile(r"finished in ([\d.]+)(m?s)")
_REQUESTS = re.compile(
    r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, "
    r"(\d+) errored, (\d+) timeout"
)


def grpc_frame(message: bytes) -> bytes:
    """``message`` as one gRPC length-prefixed message: uncompressed flag, 4-byte length."""
    return struct.pack(">BI", 0, len(message)) + message


def ensure_h2load() -> str:
    """The h2load binary, installed from Debian's ``nghttp2-client`` when missing."""
    return ensure_debian_binary("h2load", "nghttp2-client")


def spread(calls: int) -> tuple[int, int]:
    """(connections, streams each) for ``calls`` in flight: up to 8 connections, the calls
    shared evenly among them (a gRPC client holds one or a few channels and multiplexes its
    calls over each)."""
    connections = min(calls, 8)
    return connections, max(1, calls // connections)


@dataclass(frozen=True, slots=True)
class H2loadResult:
    calls: int
    seconds: float
    done: int
    """Calls answered with HTTP status 200 (their gRPC status is the server's count's to say)."""
    failed: int
    """Calls h2load saw fail: another HTTP status, a reset stream, a socket error."""
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float

    @property
    def rate_per_s(self) -> float:
        return self.done / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "connections": self.calls,
            "seconds": round(self.seconds, 3),
            "requests": self.done + self.failed,
            "answered": self.done,
            "failed": self.failed,
            "rate_per_s": round(self.rate_per_s, 1),
            "p50_ms": round(self.p50_ms, 3),
            "p90_ms": round(self.p90_ms, 3),
            "p99_ms": round(self.p99_ms, 3),
            "max_ms": round(self.max_ms, 3),
        }


def run_h2load(
    target: str, method: str, message: bytes, *, calls: int, seconds: float, timeout_s: float
) -> H2loadResult:
    """``calls`` closed-loop gRPC calls of ``method`` (``/package.Service/Method``) on
    ``target`` (``host:port``, plaintext) with ``message`` (serialized, unframed) for
    ``seconds``; one thread (the servers need the other core more)."""
    h2load = ensure_h2load()
    connections, streams = spread(calls)
    with tempfile.TemporaryDirectory(prefix="iotgw-h2load-") as tmp:
        body, log = Path(tmp) / "call.bin", Path(tmp) / "calls.tsv"
        body.write_bytes(grpc_frame(message))
        argv = [
            h2load,
            "-t1",
            f"-c{connections}",
            f"-m{streams}",
            f"-D{max(1, round(seconds))}",
            # A connection that sees no reply for this long is given up (its calls failed).
            f"-N{max(1, round(timeout_s))}",
            "-d",
            str(body),
            *(part for h in HEADERS for part in ("-H", h)),
            "--log-file",
            str(log),
            f"http://{target}{method}",
        ]
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=seconds + timeout_s + 30, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"h2load failed ({done.returncode}): {done.stderr[-2000:]}")
        return _parse(done.stdout, log.read_text(encoding="utf-8"), calls)


def _parse(stdout: str, log: str, calls: int) -> H2loadResult:
    finished, counts = _FINISHED.search(stdout), _REQUESTS.search(stdout)
    if finished is None or counts is None:
        raise RuntimeError(f"h2load's output not understood:\n{stdout[-2000:]}")
    seconds = float(finished[1]) / (1000.0 if finished[2] == "ms" else 1.0)
    durations_us, ok = [], 0
    for line in log.splitlines():
        parts = line.split("\t")
        if len(parts) >= 3 and parts[1] == "200":
            ok += 1
            durations_us.append(float(parts[2]))
    failed = int(counts[5]) + int(counts[6]) + int(counts[7]) + (int(counts[4]) - ok)
    if durations_us:
        p50, p90, p99 = np.percentile(np.array(durations_us) / 1000.0, [50, 90, 99]).tolist()
        top = max(durations_us) / 1000.0
    else:
        p50 = p90 = p99 = top = 0.0
    return H2loadResult(calls, seconds, ok, max(failed, 0), p50, p90, p99, top)
