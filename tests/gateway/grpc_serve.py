"""``iotgw serve`` with gRPC for the gRPC tests: started once per module, its ports read from
its log, stopped with SIGTERM (a clean drain must exit 0)."""

from __future__ import annotations

import contextlib
import re
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from models.demo import config_toml
from models.repository import CONFIG_FILE, ModelConfig, read_config
from tests.gateway.serve_process import Serve, serve

_GRPC_LINE = re.compile(r"gRPC listening on grpcs?://[^:]+:(\d+)")


@dataclass
class GrpcServe:
    process: Serve
    grpc_port: int

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http(self) -> str:
        return f"127.0.0.1:{self.process.http_port}"


@contextlib.contextmanager
def grpc_serve(repo: Path, folder: Path, *args: str) -> Iterator[GrpcServe]:
    """Ready (every model loaded) on a free HTTP and a free gRPC port; ``args`` are more serve
    options. On the way out: SIGTERM, and the exit status must be 0."""
    with serve(repo, folder, "--no-mqtt", "--grpc-port", "0", *args) as proc:
        proc.wait_ready()
        match = _GRPC_LINE.search(proc.text())
        assert match is not None, proc.text()
        yield GrpcServe(proc, int(match.group(1)))
        proc.process.send_signal(signal.SIGTERM)
        assert proc.wait_exit(60) == 0, proc.text()


def add_variant(repo: Path, source: str, name: str, batching: dict[str, object]) -> None:
    """A copy of ``repo``'s ``source`` model (version 1, its files linked) named ``name``, with
    its batching overridden."""
    src = repo / source / "1"
    config = read_config(src / CONFIG_FILE)
    doc = config.model_dump()
    doc["batching"] = {**doc["batching"], **batching}
    target = repo / name / "1"
    target.mkdir(parents=True)
    (target / config.path).symlink_to((src / config.path).resolve())
    (target / CONFIG_FILE).write_text(
        config_toml(ModelConfig.model_validate(doc)), encoding="utf-8"
    )
