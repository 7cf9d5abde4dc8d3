"""``benchmarks.h2load``: the gRPC framing it sends, how it spreads calls over connections, and
how it reads h2load's report and per-request log (the report below is h2load 1.52's, as it
printed against a gateway)."""

from __future__ import annotations

import struct

import pytest

from benchmarks.h2load import _parse, grpc_frame, spread

REPORT = """starting benchmark...
spawning thread #0: 2 total client(s). Timing-based test with 0s of warm-up time and 1s of main \
duration for measurements.
Main benchmark duration is over for thread #0. Stopping all clients.
Stopped all clients for thread #0

finished in 1.00s, 2362.00 req/s, 316.33KB/s
requests: 2362 total, 2370 started, 2362 done, 2362 succeeded, 0 failed, 0 errored, 0 timeout
status codes: 2362 2xx, 0 3xx, 0 4xx, 0 5xx
"""


def test_a_grpc_message_is_length_prefixed_and_uncompressed() -> None:
    framed = grpc_frame(b"abc")
    assert framed[:5] == struct.pack(">BI", 0, 3) and framed[5:] == b"abc"


@pytest.mark.parametrize(
    ("calls", "expected"), [(1, (1, 1)), (8, (8, 1)), (32, (8, 4)), (128, (8, 16))]
)
def test_calls_are_shared_evenly_over_at_most_eight_connections(
    calls: int, expected: tuple[int, int]
) -> None:
    connections, streams = spread(calls)
    assert (connections, streams) == expected and connections * streams == calls


def test_the_report_gives_the_time_and_the_log_the_latencies() -> None:
    log = "".join(f"1700000000{i:06d}\t200\t{1000 * (i + 1)}\n" for i in range(100))
    report = REPORT.replace(
        "2362 total, 2370 started, 2362 done, 2362 succeeded",
        "100 total, 104 started, 100 done, 100 succeeded",
    )
    result = _parse(report, log, calls=4)
    assert result.seconds == 1.0 and result.done == 100 and result.failed == 0
    assert result.rate_per_s == 100.0
    assert result.p50_ms == pytest.approx(50.5) and result.p99_ms == pytest.approx(99.01)
    assert result.max_ms == 100.0


def test_a_failed_stream_or_another_status_is_not_answered() -> None:
    """h2load logs a failed stream as status -1; an HTTP error status is not a gRPC reply."""
    report = REPORT.replace(
        "2362 total, 2370 started, 2362 done, 2362 succeeded, 0 failed",
        "4 total, 4 started, 4 done, 3 succeeded, 1 failed",
    )
    log = "1\t200\t1000\n2\t-1\t5000\n3\t503\t2000\n4\t200\t3000\n"
    result = _parse(report.replace("finished in 1.00s", "finished in 500.0ms"), log, calls=1)
    assert result.seconds == 0.5 and result.done == 2
    assert result.failed == 2  # the failed stream, and the 503 h2load counted as succeeded
    assert result.p50_ms == pytest.approx(2.0)


def test_a_report_it_cannot_read_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="not understood"):
        _parse("connect failed", "", calls=1)
