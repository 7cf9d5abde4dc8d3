"""``iotgw sim`` end to end: the real CLI function, run on a worker thread (it owns its event
loop) while the responder serves on the test's loop."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from device_sim.cli import main
from device_sim.trace import read_trace
from tests.device_sim.conftest import Mosquitto
from tests.device_sim.responders import METADATA, MqttResponder, http_app, serving

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


async def test_run_with_a_scenario_writes_summary_and_plots(
    mosquitto: Mosquitto, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    metadata = tmp_path / "toy.json"
    metadata.write_text(json.dumps(METADATA))
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(
        "[[phases]]\nname = 'calm'\nduration_s = 1\nprocess = 'poisson'\nrate = 20\n"
        "[[phases]]\nname = 'burst'\nduration_s = 1\nprocess = 'onoff'\nrate = 80\n"
        "on_s = 0.5\noff_s = 0.5\n"
    )
    out = tmp_path / "out"
    async with MqttResponder(mosquitto.port, service_s=0.005, drop_every=7) as responder:
        code = await asyncio.to_thread(
            main,
            [
                "run",
                "--scenario",
                str(scenario),
                "--model",
                "toy",
                "--metadata",
                str(metadata),
                "--broker",
                mosquitto.url,
                "--devices",
                "12",
                "--timeout-s",
                "0.5",
                "--slo-ms",
                "50",
                "--seed",
                "3",
                "--out",
                str(out),
            ],
        )
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    r = summary["requests"]
    assert r["planned"] == responder.received
    assert r["lost"] == responder.dropped and r["ok"] == r["planned"] - r["lost"]
    assert [p["name"] for p in summary["phases"]] == ["calm", "burst"]
    assert sum(p["requests"]["planned"] for p in summary["phases"]) == r["planned"]
    assert summary["slo"]["slo_ms"] == 50.0
    assert summary["run"]["transport"] == "mqtt5" and summary["run"]["seed"] == 3
    for name in ("latency.png", "rate.png", "errors.png"):
        assert (out / name).read_bytes().startswith(PNG_MAGIC)
    stdout = capsys.readouterr()
    assert f"{r['lost']} lost" in stdout.out
    assert "sent" in stdout.err  # the per-second progress line
    # What carried the requests, before the first one and in the headline: --broker alone
    # runs MQTT 5, and the console says so (with no metadata URL, none is named).
    head = f"MQTT 5 via mqtt://127.0.0.1:{mosquitto.port} (QoS 1, JSON; replies on each "
    assert stdout.err.startswith(
        f"iotgw sim run: {r['planned']:,} requests from 12 devices to toy over {head}"
    ), stdout.err
    assert "metadata from" not in stdout.err.splitlines()[0]
    assert stdout.out.startswith(f"transport: {head}"), stdout.out


async def test_run_over_http_with_metadata_from_the_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with serving(http_app(service_s=0.002)) as url:
        code = await asyncio.to_thread(
            main,
            [
                "run",
                "--transport",
                "http",
                "--http-url",
                url,
                "--model",
                "toy",
                "--arrival",
                "constant",
                "--rate",
                "40",
                "--duration",
                "1",
                "--framing",
                "binary",
                "--quiet",
                "--no-plots",
                "--out",
                str(tmp_path),
            ],
        )
    assert code == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["requests"]["ok"] == 40 and summary["offered_rps"] == 40.0
    assert not (tmp_path / "rate.png").exists()
    assert summary["run"]["target"] == url
    out = capsys.readouterr()
    assert out.out.startswith(f"transport: HTTP to {url} (binary)\n"), out.out
    assert out.err == ""  # --quiet: no start line, no progress


async def test_record_command_writes_a_trace(mosquitto: Mosquitto, tmp_path: Path) -> None:
    trace = tmp_path / "rec.csv"
    recording = asyncio.create_task(
        asyncio.to_thread(
            main,
            [
                "record",
                "--broker",
                mosquitto.url,
                "--out",
                str(trace),
                "--count",
                "5",
                "--duration-s",
                "20",
            ],
        )
    )
    import aiomqtt

    async with aiomqtt.Client(mosquitto.host, mosquitto.port) as client:
        # Publish until the recorder (on its own thread) has subscribed and seen five.
        for i in range(200):
            if recording.done():
                break
            await client.publish(f"iotgw/infer/toy/req/dev{i}", b'{"id": "x"}', qos=1)
            await asyncio.sleep(0.05)
    assert await recording == 0
    entries = read_trace(trace)
    assert len(entries) == 5
    assert all(e.model == "toy" and e.payload for e in entries)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "--arrival", "poisson", "--rate", "5", "--duration", "1"], "--model"),
        (["run", "--arrival", "poisson", "--model", "m"], "needs --rate and --duration"),
        (
            [
                "run",
                "--arrival",
                "constant",
                "--rate",
                "5",
                "--duration",
                "1",
                "--model",
                "m",
                "--broker",
                "mqtt://192.0.2.1:1883",
            ],
            "loopback",
        ),
        (["run", "--trace", "missing.csv"], "missing.csv"),
        (
            [
                "run",
                "--arrival",
                "constant",
                "--rate",
                "5",
                "--duration",
                "1",
                "--model",
                "m",
                "--transport",
                "http",
            ],
            "--http-url",
        ),
        (["record", "--out", "x.txt", "--broker", "mqtt://10.1.2.3"], "loopback"),
    ],
)
def test_bad_invocations_exit_2_with_the_reason(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_an_unreachable_broker_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    metadata = tmp_path / "toy.json"
    metadata.write_text(json.dumps(METADATA))
    argv = [
        "run",
        "--arrival",
        "constant",
        "--rate",
        "5",
        "--duration",
        "1",
        "--model",
        "toy",
        "--metadata",
        str(metadata),
        "--broker",
        f"mqtt://127.0.0.1:{closed_port}",
        "--out",
        str(tmp_path / "out"),
    ]
    assert main(argv) == 1
    assert "cannot connect" in capsys.readouterr().err


def test_help_and_usage_errors_return_instead_of_exiting(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["run", "--help"]) == 0
    assert "--arrival" in capsys.readouterr().out
    assert main(["run", "--transport", "carrier-pigeon"]) == 2
    assert main([]) == 2
