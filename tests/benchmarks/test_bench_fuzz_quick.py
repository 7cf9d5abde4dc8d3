"""``iotgw bench fuzz --quick``: a few thousand fuzzed payloads on HTTP, MQTT and gRPC against a
real gateway and Mosquitto. The gateway must neither crash nor leave a request unanswered, must
answer bad input with a 4xx error reply (over gRPC a client-error code; or a valid answer), and
must answer every well-formed request interleaved with the fuzz, then still be ready and serving
on every transport."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.common import source_commit
from tests.benchmarks.bench_process import run_bench

pytestmark = pytest.mark.slow


def test_bench_fuzz_quick_meets_its_targets(tmp_path: Path) -> None:
    run_bench("gateway.cli", "bench", "fuzz", "--quick", "--out", str(tmp_path))
    doc = json.loads((tmp_path / "fuzz.quick.json").read_text())
    assert doc["benchmark"] == "fuzz" and doc["quick"] is True
    assert doc["config"]["code"] == source_commit()  # the checkout the run started from
    transports = doc["transports"]
    assert set(transports) == {"http", "mqtt", "grpc"}
    # What went wrong, with payloads, so that a failure here names its cause.
    examples = {name: t["examples"] for name, t in transports.items()}
    detail = json.dumps({"restarts": doc["restarts"], "examples": examples}, indent=1)[:6000]
    summary = doc["summary"]
    assert summary["crashes"] == 0, detail
    assert summary["gateway_restarts"] == 0, detail
    assert summary["stuck"] == 0, detail
    assert summary["non_4xx_for_bad_input"] == 0, detail
    assert summary["good_answered_ratio"] == 1.0, detail
    assert summary["final_ready"] is True, detail
    assert summary["final_good_answered"] == summary["final_good_sent"], detail
    for name, t in transports.items():  # the whole slice was sent (no transport given up)
        assert t["payloads"] == 1500 and t["good_sent"] > 0, name
