"""Trace files: write -> read round trips in both encodings, validation, replay plans."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from device_sim.plan import plan_from_trace
from device_sim.trace import TraceEntry, read_trace, write_trace

ENTRIES = [
    TraceEntry(0.0, "dev0", "sensor_mlp", "rec.payloads/aa.bin"),
    TraceEntry(0.125, "dev1", "vision_cnn", None),
    TraceEntry(0.5, "dev0", "sensor_mlp", "rec.payloads/bb.bin"),
    TraceEntry(1.75, "dev2", "sensor_mlp", None),
]


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_write_then_read_gives_the_same_entries(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"trace{suffix}"
    write_trace(path, ENTRIES)
    assert read_trace(path) == ENTRIES


def test_the_documented_formats_are_what_is_written(tmp_path: Path) -> None:
    csv_path, jsonl_path = tmp_path / "t.csv", tmp_path / "t.jsonl"
    write_trace(csv_path, ENTRIES[:2])
    write_trace(jsonl_path, ENTRIES[:2])
    assert csv_path.read_text().splitlines() == [
        "t,device,model,payload",
        "0.0,dev0,sensor_mlp,rec.payloads/aa.bin",
        "0.125,dev1,vision_cnn,",
    ]
    assert jsonl_path.read_text().splitlines() == [
        '{"t": 0.0, "device": "dev0", "model": "sensor_mlp", "payload": "rec.payloads/aa.bin"}',
        '{"t": 0.125, "device": "dev1", "model": "vision_cnn"}',
    ]


def test_hand_written_traces_are_read_in_time_order(tmp_path: Path) -> None:
    path = tmp_path / "hand.csv"
    path.write_text("device,model,t\nb,m,2\na,m,1\nc,m,1\n")  # any column order, no payload
    assert [(e.device, e.t, e.payload) for e in read_trace(path)] == [
        ("a", 1.0, None),
        ("c", 1.0, None),
        ("b", 2.0, None),
    ]


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("x.txt", "", "must end in .csv or .jsonl"),
        ("x.csv", "t,device\n1,a\n", "lacks \\['model'\\]"),
        ("x.csv", "t,device,model\nsoon,a,m\n", "x.csv:2: t must be a number"),
        ("x.jsonl", '{"t": -1, "device": "a", "model": "m"}\n', "t must be >= 0"),
        ("x.jsonl", '{"t": 1, "device": "a/b", "model": "m"}\n', "topic level"),
        ("x.jsonl", "[1]\n", "JSON object"),
    ],
)
def test_bad_traces_name_file_line_and_problem(
    tmp_path: Path, name: str, text: str, message: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        read_trace(path)


def test_replay_plan_scales_time_and_keeps_devices_models_payloads() -> None:
    plan = plan_from_trace(ENTRIES, speed=2.0, max_requests=100, max_duration_s=100)
    np.testing.assert_allclose(plan.times, [0.0, 0.0625, 0.25, 0.875])
    assert plan.devices == ("dev0", "dev1", "dev2")
    assert plan.models == ("sensor_mlp", "vision_cnn")
    assert plan.device.tolist() == [0, 1, 0, 2]
    assert plan.payloads == tuple(e.payload for e in ENTRIES)
    # Span plus one mean gap: 4 requests over 0.875 s -> window 0.875 * 4/3.
    assert plan.duration_s == pytest.approx(0.875 * 4 / 3)
    cut = plan_from_trace(ENTRIES, speed=1.0, max_requests=100, max_duration_s=0.6)
    assert len(cut) == 3
