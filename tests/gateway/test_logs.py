"""Quiet logs: at INFO the gateway's lifecycle on one screen, ending with the ready line; each
model's, instance's and library's detail only at DEBUG; nothing at WARNING when all is well (no
TensorFlow banner); one JSON object per line when asked."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.logs import DETAIL_LOGGERS, configure_logging
from tests.brokers import free_port
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
def test_serve_start_up_fits_on_a_screen_and_ends_with_the_ready_line(
    demo_repo: Path, tmp_path: Path
) -> None:
    """At INFO: the repository, the broker, HTTP, how many models loaded, MQTT subscribed, then
    one ready line naming the topics; each model's detail is at DEBUG."""
    repo = make_repo(tmp_path / "repo", demo_repo, dict.fromkeys(MODELS))
    with serve(repo, tmp_path, "--mqtt-port", str(free_port())) as gw:
        gw.wait_ready()
        gw.process.send_signal(signal.SIGTERM)
        assert gw.wait_exit() == 0
        lines = gw.text().splitlines()
    ready = [i for i, line in enumerate(lines) if " INFO gateway: ready: http://" in line]
    assert len(ready) == 1, lines
    start_up = lines[: ready[0] + 1]
    assert len(start_up) <= 8, start_up
    assert any("2 of 2 model versions loaded" in line for line in start_up)
    subscribed = [i for i, line in enumerate(start_up) if "MQTT: connected" in line]
    assert subscribed and subscribed[0] < ready[0]  # ready once MQTT takes requests
    assert "devices publish to iotgw/infer/<model>/req/<device_id>" in lines[ready[0]]
    assert not [line for line in lines if any(f" {m} " in line for m in MODELS)]
    assert not [line for line in lines if " models.onnx: " in line or " instances: " in line]


@pytest.mark.slow
def test_serve_at_warning_prints_nothing_when_all_is_well(demo_repo: Path, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", demo_repo, {"sensor_mlp": None, "sensor_mlp_tf": None})
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    with serve(repo, tmp_path, "--no-mqtt", "--log-level", "WARNING", env=env) as gw:
        gw.wait_ready()
        gw.process.send_signal(signal.SIGTERM)
        assert gw.wait_exit() == 0
        assert gw.text() == ""


@pytest.mark.parametrize(
    ("level", "operator", "seen"),
    [("WARNING", None, "3"), ("ERROR", None, "3"), ("INFO", None, "2"), ("WARNING", "1", "1")],
)
def test_tensorflow_native_logs_are_quiet_at_warning(
    level: str, operator: str | None, seen: str
) -> None:
    """TensorFlow reads TF_CPP_MIN_LOG_LEVEL once, at import, after models.tf_env: the level
    configure_logging leaves there (3 hides its import banners) unless the operator chose one.
    (Importing TensorFlow itself costs 10-20 s here; the test at WARNING above serves a
    TensorFlow model and reads its whole output.)"""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    if operator is not None:
        env["TF_CPP_MIN_LOG_LEVEL"] = operator
    code = (
        "import os\n"
        "from gateway.logs import configure_logging\n"
        f"configure_logging({level!r})\n"
        "from models import tf_env\n"
        "print(os.environ['TF_CPP_MIN_LOG_LEVEL'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == seen


@pytest.mark.parametrize(("level", "hidden"), [("INFO", "IW"), ("WARNING", "IWE"), ("DEBUG", "")])
def test_tensorflow_import_lines_are_filtered_below_debug(level: str, hidden: str) -> None:
    """TensorFlow 2.21 prints absl's banner and the oneDNN INFO line at import whatever
    TF_CPP_MIN_LOG_LEVEL says; at INFO too the first import runs filtered by the level in force
    (2: INFO and WARNING lines), and only DEBUG lets a library's detail through."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    code = (
        "import sys\n"
        "from gateway.logs import configure_logging\n"
        f"configure_logging({level!r})\n"
        "from models.tf_env import _QuietImport\n"
        "print(''.join(f._hidden for f in sys.meta_path if isinstance(f, _QuietImport)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == hidden
