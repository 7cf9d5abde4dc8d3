"""Every shell block of README.md and docs/ runs, as written, against a live ``iotgw serve``
(the demo models, HTTP and the embedded MQTT broker), so a documented command that breaks fails
the tests. Blocks that cannot run here (docker, kubectl, a GPU, a whole test run) say so in the
Markdown (``<!-- doctest: skip (why) -->``) and are reported as skipped; see tests/docs/markdown.py
for the other clauses.

The one rewrite applied to every block: the documented addresses ``localhost:8080``,
``127.0.0.1:8080``, ``localhost:8001`` (gRPC) and ``127.0.0.1:1883`` become the live gateway's,
which listens on free ports (8080, 8001 and 1883 may be taken on the machine that runs the
tests). The blocks of one page run in
order in one folder, so a page can write a file and use it later; anything else a block needs
(an input file made from code, a free port, a Mosquitto of its own, a smaller budget) its
directive asks for, in the Markdown (tests/docs/pages.py holds what a page's blocks share).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.brokers import free_port
from tests.docs.inputs import MAKERS
from tests.docs.markdown import SHELL, Block, blocks, documents
from tests.docs.pages import Page
from tests.gateway.serve_process import Serve, serve

ALL = [b for doc in documents() for b in blocks(doc)]
SHELL_BLOCKS = [b for b in ALL if b.lang in SHELL]
LAST_OF_PAGE = {b.path: b for b in SHELL_BLOCKS}  # the page's state is dropped after it
RESULTS: list[tuple[str, str]] = []  # (where, "ran" | "skipped: why"), for the summary line


def test_every_fence_names_its_language() -> None:
    """An unlabelled block could hide a command from the doc test: ``sh`` runs, ``text`` not."""
    unlabelled = [b.where for b in ALL if not b.lang]
    assert unlabelled == [], f"label these fences (sh, text, toml, ...): {unlabelled}"


def test_directives_are_well_formed() -> None:
    for block in ALL:
        block.command()  # every 'replace' must match its block
        if block.file is not None:
            assert block.lang not in SHELL, f"{block.where}: 'file' is for non-shell blocks"
        runs = (block.replace, block.expect, block.env, block.prepare, block.until)
        if block.skip is not None or any(runs):
            assert block.lang in SHELL, f"{block.where}: run clauses on a block that never runs"
        unknown = set(block.prepare) - set(MAKERS)
        assert not unknown, f"{block.where}: no input maker named {sorted(unknown)}"
        if block.background:
            assert block.until, f"{block.where}: 'background' needs 'until REGEX'"


@pytest.fixture(scope="module", name="live")
def live_fixture(demo_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    folder = tmp_path_factory.mktemp("doc-gateway")
    with serve(demo_repo, folder, "--mqtt-port", str(free_port())) as gw:
        gw.wait_ready()
        yield gw


@pytest.fixture(scope="module", name="pages")
def pages_fixture(demo_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pages]:
    pages = Pages(demo_repo, tmp_path_factory)
    try:
        yield pages
    finally:
        pages.close_all()


class Pages:
    """Each page's shared state, opened at its first block and closed after its last."""

    def __init__(self, demo_repo: Path, tmp: pytest.TempPathFactory) -> None:
        self.demo_repo, self.tmp = demo_repo, tmp
        self.open: dict[Path, Page] = {}

    def of(self, block: Block) -> Page:
        if block.path not in self.open:
            folder = self.tmp.mktemp(block.path.stem)
            self.open[block.path] = Page.open(block.path, folder, self.demo_repo)
        return self.open[block.path]

    def done(self, block: Block) -> None:
        if block is LAST_OF_PAGE[block.path] and block.path in self.open:
            self.open.pop(block.path).close()

    def close_all(self) -> None:
        while self.open:
            self.open.popitem()[1].close()


def _mqtt_port(gw: Serve) -> int:
    found = re.search(r"mqtt://127\.0\.0\.1:(\d+)", gw.text())
    assert found, f"the gateway's log names no MQTT address:\n{gw.text()}"
    return int(found.group(1))


def _grpc_port(gw: Serve) -> int:
    found = re.search(r"gRPC listening on grpcs?://127\.0\.0\.1:(\d+)", gw.text())
    assert found, f"the gateway's log names no gRPC address:\n{gw.text()}"
    return int(found.group(1))


@pytest.mark.slow
@pytest.mark.parametrize("block", SHELL_BLOCKS, ids=[b.where for b in SHELL_BLOCKS])
def test_documented_block_runs(block: Block, live: Serve, pages: Pages) -> None:
    try:
        _run(block, live, pages)
    finally:
        pages.done(block)


def _run(block: Block, live: Serve, pages: Pages) -> None:
    if block.skip is not None:
        RESULTS.append((block.where, f"skipped: {block.skip}"))
        pytest.skip(block.skip)
    page = pages.of(block)
    command = (
        block.command(page.expand)
        .replace("localhost:8080", f"127.0.0.1:{live.http_port}")
        .replace("127.0.0.1:8080", f"127.0.0.1:{live.http_port}")
        .replace("127.0.0.1:1883", f"127.0.0.1:{_mqtt_port(live)}")
        .replace("localhost:8001", f"127.0.0.1:{_grpc_port(live)}")
    )
    bindir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
        **block.environment(page.expand),
    }
    page.prepare(block, env)
    if block.until is not None:
        stdout = page.start(block, command, env)
        shown = f"{block.where}:\n{command}\n--- output\n{stdout}"
    else:
        try:
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", command],
                cwd=page.folder,
                env=env,
                capture_output=True,
                text=True,
                timeout=block.timeout_s,
            )
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(
                f"{block.where} ran past {block.timeout_s:g} s:\n{command}"
            ) from exc
        stdout = done.stdout
        shown = f"{block.where} exited {done.returncode}:\n{command}\n--- stdout\n{stdout}"
        assert done.returncode == 0, f"{shown}\n--- stderr\n{done.stderr}"
    for pattern in block.expect:
        assert re.search(pattern, stdout), f"{block.where}: no match for {pattern!r}\n{shown}"
    RESULTS.append((block.where, "ran"))
