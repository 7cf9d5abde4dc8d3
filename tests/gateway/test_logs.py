"""Quiet logs: at INFO the gateway's lifecycle and one line per model, library and per-instance
detail only at DEBUG; one JSON object per line when asked."""

from __future__ import annotations

import json
import logging
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.logs import DETAIL_LOGGERS, configure_logging
from tests.gateway.helpers import make_repo
from tests.gateway.serve_process import serve

MODELS = ("sensor_mlp", "sensor_fusion")


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    levels = {name: logging.getLogger(name).level for name in DETAIL_LOGGERS}
    yield
    root.handlers[:], root.level = handlers, level
    for name, value in levels.items():
        logging.getLogger(name).setLevel(value)


@pytest.mark.usefixtures("restore_logging")
def test_detail_loggers_speak_at_debug_only() -> None:
    configure_logging("INFO")
    assert not logging.getLogger("amqtt").isEnabledFor(logging.INFO)
    assert not logging.getLogger("gateway.instances").isEnabledFor(logging.INFO)
    assert logging.getLogger("gateway").isEnabledFor(logging.INFO)
    configure_logging("DEBUG")
    assert logging.getLogger("amqtt").isEnabledFor(logging.DEBUG)


@pytest.mark.usefixtures("restore_logging")
def test_json_lines(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("INFO", "json")
    logging.getLogger("gateway").info("ready: %s", "http://127.0.0.1:1/v2")
    (line,) = capsys.readouterr().err.strip().splitlines()
    doc = json.loads(line)
    assert doc["level"] == "INFO" and doc["logger"] == "gateway"
    assert doc["message"] == "ready: http://127.0.0.1:1/v2"


@pytest.mark.slow
def test_serve_logs_one_line_per_model_at_info(demo_repo: Path, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", demo_repo, dict.fromkeys(MODELS))
    with serve(repo, tmp_path, "--no-mqtt") as gw:
        gw.wait_ready()
        gw.process.send_signal(signal.SIGTERM)
        assert gw.wait_exit() == 0
        lines = gw.text().splitlines()
    per_model = {m: [line for line in lines if f" {m} " in line] for m in MODELS}
    assert all(len(found) == 1 for found in per_model.values()), per_model
    assert not [
        line for line in lines if " models.onnx: " in line or " gateway.instances: " in line
    ]
    assert any("2 of 2 model versions ready" in line for line in lines)
