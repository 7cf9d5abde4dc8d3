"""build_once: one complete result whatever happens, with cheap real builders."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from models.atomic_dir import build_once

DONE = "done"


def _complete(path: Path) -> bool:
    return (path / DONE).is_file()


def _builder(calls: list[str], payload: str = "x") -> Callable[[Path], None]:
    def build(tmp: Path) -> None:
        calls.append(str(tmp))
        (tmp / "data").write_text(payload)
        (tmp / DONE).write_text("")

    return build


def _hidden(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if p.name.startswith(".")]


def test_builds_once(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    calls: list[str] = []
    assert build_once(dest, _builder(calls), _complete) == dest
    assert build_once(dest, _builder(calls), _complete) == dest
    assert len(calls) == 1
    assert (dest / "data").read_text() == "x"
    assert _hidden(tmp_path) == []


def test_failed_build_leaves_nothing(tmp_path: Path) -> None:
    dest = tmp_path / "out"

    def crash(tmp: Path) -> None:
        (tmp / "partial").write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        build_once(dest, crash, _complete)
    assert not dest.exists()
    assert _hidden(tmp_path) == []


def test_incomplete_result_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="incomplete"):
        build_once(tmp_path / "out", lambda tmp: None, _complete)
    assert list(tmp_path.iterdir()) == []


def test_stale_destination_is_replaced(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "leftover").write_text("old")
    calls: list[str] = []
    build_once(dest, _builder(calls, "new"), _complete)
    assert sorted(p.name for p in dest.iterdir()) == ["data", DONE]
    assert (dest / "data").read_text() == "new"
    assert _hidden(tmp_path) == []


def test_concurrent_builders_publish_one_complete_result(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    barrier = threading.Barrier(4)
    calls: list[str] = []
    errors: list[BaseException] = []

    def build(tmp: Path) -> None:
        barrier.wait()  # every builder is mid-build before any publishes
        _builder(calls, tmp.name)(tmp)

    def worker() -> None:
        try:
            build_once(dest, build, _complete)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(calls) == 4
    assert _complete(dest)
    assert sorted(p.name for p in dest.iterdir()) == ["data", DONE]
    assert _hidden(tmp_path) == []
