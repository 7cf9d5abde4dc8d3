"""The device simulator against a real gateway process on a real Mosquitto: every transport
and framing answered in full, nothing lost, the figures in the summary consistent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from device_sim.cli import main as sim_main
from tests.brokers import mosquitto
from tests.gateway.helpers import make_repo
from tests.gateway.processes import gateway_process

pytestmark = pytest.mark.slow


def test_simulated_devices_on_every_transport_get_every_answer(
    demo_repo: Path, tmp_path: Path
) -> None:
    # The two ONNX models the devices use, not the whole demo repository (TensorFlow too).
    repo = make_repo(tmp_path / "repo", demo_repo, {"sensor_mlp": None, "vision_cnn": None})
    with (
        mosquitto(tmp_path) as broker,
        gateway_process(repo, tmp_path, broker=broker.url, client_id="gw-sim") as gw,
    ):
        for transport, framing in [("mqtt5", "json"), ("mqtt311", "binary"), ("http", "binary")]:
            out = tmp_path / f"{transport}-{framing}"
            rc = sim_main(
                [
                    "run",
                    "--transport",
                    transport,
                    "--framing",
                    framing,
                    "--broker",
                    broker.url,
                    "--http-url",
                    gw.url,
                    "--arrival",
                    "poisson",
                    "--rate",
                    "40",
                    "--duration",
                    "2",
                    "--seed",
                    "3",
                    "--devices",
                    "10",
                    "--model",
                    "sensor_mlp",
                    "--model",
                    "vision_cnn",
                    "--slo-ms",
                    "5000",
                    # A correctness test: every request gets a deadline far beyond any wait on
                    # a busy machine, so an answer is a 200, never a deadline 503.
                    "--deadline-ms",
                    "20000",
                    "--timeout-s",
                    "30",
                    "--out",
                    str(out),
                    "--quiet",
                ]
            )
            assert rc == 0
            summary = json.loads((out / "summary.json").read_text())
            requests = summary["requests"]
            assert requests["sent"] == requests["planned"] > 0, (transport, requests)
            assert requests["ok"] == requests["sent"], (transport, summary["errors"])
            assert requests["lost"] == 0 and summary["errors"] == {}
            for plot in ("latency.png", "rate.png", "errors.png"):
                assert (out / plot).stat().st_size > 0
