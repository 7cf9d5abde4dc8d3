"""``iotgw bench chaos --quick --cases abcd``: the gateway SIGKILLed and restarted, the broker
restarted, two of three replicas stopped, and overload, each under QoS 1 load from device
processes that account for every request id they published, and in the SIGKILL and replica
cases (a, c) gRPC clients calling the gateways beside them, accounted the same way. Nothing may
be lost; overload must be answered (503 replies), not met with silence. No timing is
asserted. Case f (partitions, on
network namespaces) has a test of its own: ``test_bench_chaos_partition_quick``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.common import source_commit
from tests.benchmarks.bench_process import run_bench

pytestmark = pytest.mark.slow

CASES = (
    "a_gateway_sigkill",
    "b_broker_restart",
    "c_replicas",
    "d_overload_mosquitto",
    "d_overload_embedded",
)


def test_bench_chaos_quick_loses_no_request(tmp_path: Path) -> None:
    run_bench(
        *("gateway.cli", "bench", "chaos", "--quick", "--cases", "abcd", "--out", str(tmp_path))
    )
    doc = json.loads((tmp_path / "chaos_abcd.quick.json").read_text())
    # A run of some cases is named for them, so it never stands in for chaos.json.
    assert doc["benchmark"] == "chaos_abcd" and doc["quick"] is True
    assert doc["config"]["cases"] == "abcd"
    assert doc["config"]["code"] == source_commit()  # the checkout the run started from
    cases = {run["case"]: run for run in doc["runs"]}
    assert set(cases) == set(CASES)
    for name, case in cases.items():
        errors = sum(case["errors"].values())
        assert case["sent"] > 0 and case["answered"] > 0, name
        assert case["sent"] == case["answered"] + errors + case["lost"], name
    for name in ("d_overload_mosquitto", "d_overload_embedded"):
        assert cases[name]["errors_503"] > 0, f"{name}: overload was not answered with 503s"
    assert doc["summary"]["rss_growth_last_20min"] is None  # no soak in --quick
    for name, case in cases.items():
        assert case["lost"] == 0, f"{name}: {case['lost']} requests without a reply"
    assert doc["summary"]["lost_qos1"] == 0
    for name in ("a_gateway_sigkill", "c_replicas"):
        grpc = cases[name]["grpc"]
        assert grpc["sent"] > 0 and grpc["answered"] > 0, name
        assert grpc["sent"] == grpc["answered"] + sum(grpc["errors"].values()) + grpc["lost"]
        assert grpc["lost"] == 0, f"{name}: {grpc['lost']} gRPC calls without an answer"
        assert grpc["unmatched_replies"] == 0, name
    assert doc["summary"]["lost_grpc"] == 0 and doc["summary"]["grpc_sent"] > 0
