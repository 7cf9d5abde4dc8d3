"""``iotgw bench mqtt --quick`` runs the whole pipeline (Mosquitto, bare echo, gateway, HTTP
comparison) and writes a results file of the agreed shape. No timing is asserted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks.bench_process import run_bench

pytestmark = pytest.mark.slow


def test_bench_mqtt_quick_writes_its_results(tmp_path: Path) -> None:
    proc = run_bench("gateway.cli", "bench", "mqtt", "--quick", "--out", str(tmp_path))
    doc = json.loads((tmp_path / "mqtt.quick.json").read_text())
    assert doc["benchmark"] == "mqtt" and doc["quick"] is True
    summary = doc["summary"]
    for key in ("qos1_p50_overhead_ms", "mqtt_vs_http_throughput_ratio", "qos0_p50_overhead_ms"):
        assert isinstance(summary[key], float), key
    assert summary["lost"] == 0
    phases = {(r["phase"], r["target"], r.get("qos")) for r in doc["runs"]}
    for qos in (0, 1):
        for target in ("echo", "gateway"):
            assert ("low_load", target, qos) in phases
            assert ("saturation", target, qos) in phases
    assert ("saturation", "gateway-http", None) in phases
    assert all(r["answered"] > 0 for r in doc["runs"] if r["phase"] == "saturation")
    assert "MQTT QoS 1 / HTTP" in proc.stdout
    assert doc["machine"]["cores"] >= 1
