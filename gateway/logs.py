"""Logging for ``iotgw serve``: at INFO the gateway's own lifecycle and one line per model;
the per-instance, per-backend and per-decision detail of our own modules and the chatter of the
libraries underneath (TensorFlow, amqtt's state machine, matplotlib, ...) only at DEBUG. Text for
people, or one JSON object per line for log shippers."""

from __future__ import annotations

import json
import logging
from typing import Literal

from models import tf_env

# Below WARNING these speak only at DEBUG: their INFO lines repeat per model, per instance or per
# tuning interval (the tuner's decisions are on /admin/tuner and the dashboard), or come from
# libraries whose INFO is their own business.
DETAIL_LOGGERS = (
    "gateway.instances",
    "models.onnx",
    "models.tf",
    "rrl.agent",
    "rrl.offline.priors",
    "absl",
    "aiohttp.access",
    "amqtt",
    "h5py",
    "keras",
    "matplotlib",
    "tensorflow",
    "transitions",
)

# Of those, the libraries underneath: at --log-level WARNING their warnings are not the
# operator's either (TensorFlow's deprecations, absl's), so they speak from ERROR up.
LIBRARY_LOGGERS = ("absl", "h5py", "keras", "tensorflow")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc)


def configure_logging(level: str, fmt: Literal["text", "json"] = "text") -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(
        JsonFormatter()
        if fmt == "json"
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    quiet = logging.DEBUG if level == "DEBUG" else max(logging.WARNING, logging.getLevelName(level))
    for name in DETAIL_LOGGERS:
        logging.getLogger(name).setLevel(quiet)
    if logging.getLevelName(level) >= logging.WARNING:
        quiet_libraries(logging.getLevelName(level))
    elif level != "DEBUG":  # TensorFlow's import banners are a library's detail: DEBUG's
        tf_env.filter_native_import_lines()


def quiet_libraries(level: int = logging.ERROR) -> None:
    """For a process asked for warnings only, or whose output is a report: TensorFlow's import
    banners (its C++ side, set before TensorFlow is imported) and the libraries' own warnings
    (TensorFlow's deprecations, absl's) are not the operator's."""
    tf_env.quiet_native_logs()
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(max(logging.ERROR, level))
