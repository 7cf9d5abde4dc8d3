"""What one page's blocks share while the doc test runs them in order: a folder (with ``.venv``
and the committed checkpoints as the docs name them, and the page's ``file`` blocks), the free
ports and the Mosquitto its directives name, and the servers its ``background`` blocks left
running. A page is closed after its last shell block: the servers stopped, the broker with
them."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.brokers import free_port, mosquitto
from tests.docs.markdown import ROOT, Block, blocks

_PLACEHOLDER = re.compile(r"\{(port:[\w-]+|broker|demo_repo)\}")
# What the docs name by its path in the checkout (their commands run from the checkout's root),
# linked into each page's folder: the committed checkpoints, read and never written.
CHECKOUT_PATHS = ("models/train/weights",)
STOP_GRACE_S = 30.0  # a gateway drains before it exits; a stopped page must not hang the test


@dataclass
class Page:
    folder: Path
    demo_repo: Path
    ports: dict[str, int] = field(default_factory=dict)
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    broker_url: str | None = None

    @classmethod
    def open(cls, doc: Path, folder: Path, demo_repo: Path) -> Page:
        (folder / ".venv").symlink_to(Path(sys.prefix))
        for relative in CHECKOUT_PATHS:
            (folder / relative).parent.mkdir(parents=True, exist_ok=True)
            (folder / relative).symlink_to(ROOT / relative)
        for block in blocks(doc):
            if block.file is not None:
                (folder / block.file).write_text(block.text, encoding="utf-8")
        return cls(folder, demo_repo)

    def expand(self, text: str) -> str:
        """``text`` with the directives' placeholders filled in."""
        return _PLACEHOLDER.sub(lambda m: self._value(m.group(1)), text)

    def _value(self, name: str) -> str:
        if name.startswith("port:"):
            return str(self.ports.setdefault(name, free_port()))
        if name == "demo_repo":
            return str(self.demo_repo)
        if self.broker_url is None:
            broker_dir = Path(tempfile.mkdtemp(prefix="broker-", dir=self.folder))
            self.broker_url = self.stack.enter_context(mosquitto(broker_dir)).url
        return self.broker_url

    def prepare(self, block: Block, env: dict[str, str]) -> None:
        """The input files the block reads, written by ``tests/docs/inputs.py``."""
        if not block.prepare:
            return
        done = subprocess.run(
            [sys.executable, "-m", "tests.docs.inputs", *block.prepare],
            cwd=self.folder,
            env={**env, "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])},
            capture_output=True,
            text=True,
            timeout=block.timeout_s,
        )
        assert done.returncode == 0, f"{block.where}: prepare failed:\n{done.stderr}"

    def start(self, block: Block, command: str, env: dict[str, str]) -> str:
        """Run an ``until`` block until its output matches; return that output. A
        ``background`` one stays up until the page closes; any other is stopped now."""
        assert block.until is not None
        log = self.folder / f"block-{block.line}.log"
        with log.open("wb") as out:
            # Its own process group: stopping it stops every process the block started.
            proc = subprocess.Popen(
                ["bash", "-euo", "pipefail", "-c", command],
                cwd=self.folder,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        stop = contextlib.ExitStack()
        stop.callback(_stop, proc)
        with stop:
            deadline = time.monotonic() + block.timeout_s
            while not re.search(block.until, text := log.read_text(errors="replace")):
                code = proc.poll()
                assert code is None, f"{block.where} exited {code} before {block.until!r}:\n{text}"
                assert time.monotonic() < deadline, (
                    f"{block.where}: no {block.until!r} in {block.timeout_s:g} s:\n{text}"
                )
                time.sleep(0.1)
            if block.background:
                self.stack.push(stop.pop_all())
        return text

    def close(self) -> None:
        self.stack.close()


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the block's process group (a gateway drains and exits), SIGKILL if it hangs."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
