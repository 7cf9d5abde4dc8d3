"""``iotgw bench chaos --quick --cases f``: the broker, two gateway replicas and the devices on
network namespaces of their own; one replica's link cut for longer than the broker's keep-alive
timeout and restored, then the broker's link cut briefly, under QoS 1 load. Every request must
end answered (200 or an error reply), none lost or answered twice. No timing is asserted: the
failover figures are the benchmark's to report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.chaos.netns import NamespacesUnavailable, check_available
from tests.benchmarks.bench_process import run_bench

pytestmark = pytest.mark.slow


def _namespaces() -> str | None:
    try:
        check_available()
    except NamespacesUnavailable as exc:
        return str(exc)
    return None


@pytest.mark.skipif(_namespaces() is not None, reason=f"no network namespaces: {_namespaces()}")
def test_partitions_lose_no_request_and_answer_each_once(tmp_path: Path) -> None:
    run_bench("gateway.cli", "bench", "chaos", "--quick", "--cases", "f", "--out", str(tmp_path))
    doc = json.loads((tmp_path / "chaos_f.quick.json").read_text())
    (case,) = doc["runs"]
    assert case["case"] == "f_partition"
    events = [e["event"] for e in case["events"]]
    assert events == [
        "replica 0 link cut",
        "replica 0 link restored",
        "broker link cut",
        "broker link restored",
    ]
    # The cut outlasted the broker's keep-alive timeout: Mosquitto closed the cut member's
    # connection (and kept its session); the broker's short cut closed none.
    drops = [(d["client"], d["what"]) for d in case["broker_dropped"]]
    assert drops == [("chaos-f0", "connection closed (keep-alive)")]
    assert case["sent_during_cut"] > 0
    errors = sum(case["errors"].values())
    assert case["sent"] > 0 and case["answered"] > 0
    assert case["sent"] == case["answered"] + errors + case["lost"]
    assert case["lost"] == 0, f"{case['lost']} requests without a reply"
    assert case["duplicates"] == 0 and case["unmatched_replies"] == 0
    assert doc["summary"]["lost_qos1_partition"] == 0
    assert doc["summary"]["duplicates_partition"] == 0
