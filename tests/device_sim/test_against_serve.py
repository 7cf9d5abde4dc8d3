"""docs/device_sim.md's commands, as written, against ``iotgw serve`` without ``--broker``: with
its embedded Mosquitto (MQTT 5) and with its amqtt fallback (MQTT 3.1.1 only). Only the port
(1883 is often taken) and the run's length differ from the documented lines."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from device_sim.cli import main as sim
from device_sim.trace import read_trace
from tests.brokers import free_port
from tests.gateway.helpers import make_repo
from tests.gateway.serve_process import serve

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sensor_repo(demo_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repo(tmp_path_factory.mktemp("repo"), demo_repo, {"sensor_mlp": None})


@pytest.mark.parametrize(("embedded", "transport"), [("mosquitto", "mqtt5"), ("amqtt", "mqtt311")])
def test_documented_run_and_record_work_against_the_default_serve(
    sensor_repo: Path, tmp_path: Path, embedded: str, transport: str
) -> None:
    port = free_port()
    broker = f"mqtt://127.0.0.1:{port}"
    with serve(
        sensor_repo, tmp_path, "--mqtt-port", str(port), "--embedded-broker", embedded
    ) as gw:
        gw.wait_ready()
        trace = tmp_path / "traces" / "morning.csv"
        codes: list[int] = []
        record = ["record", "--out", str(trace), "--duration-s", "60", "--count", "10"]
        record += ["--broker", broker]
        recorder = threading.Thread(target=lambda: codes.append(sim(record)))
        recorder.start()
        out = tmp_path / "results" / "poisson"
        run = ["run", "--arrival", "poisson", "--rate", "30", "--duration", "3", "--devices"]
        run += ["5", "--model", "sensor_mlp", "--http-url", gw.url, "--slo-ms", "5000"]
        run += ["--timeout-s", "30", "--out", str(out), "--quiet", "--broker", broker]
        assert sim(run) == 0
        recorder.join(timeout=60)
        assert codes == [0]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["run"]["transport"] == transport
    requests = summary["requests"]
    assert requests["ok"] == requests["planned"] > 0, summary["errors"]
    entries = read_trace(trace)
    assert len(entries) == 10 and {e.model for e in entries} == {"sensor_mlp"}
