"""Build a directory once and publish it with an atomic rename.

Readers only ever see a missing directory or a complete one: the content is built in a hidden
sibling folder and renamed into place, so a crash mid-build or two processes building at the same
time never leave a half-written result behind.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

# Hidden build folders older than this belong to a crashed build (a live build takes seconds).
_ABANDONED_AFTER_S = 3600.0


def build_once(
    dest: Path, build: Callable[[Path], object], is_complete: Callable[[Path], bool]
) -> Path:
    """Return ``dest`` once ``is_complete(dest)``, calling ``build(tmp)`` only if needed.

    ``build`` fills an empty folder; ``is_complete`` must recognise a finished build (for example
    by a manifest written last). A stale or incomplete ``dest`` is replaced.
    """
    if is_complete(dest):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(dest)
    # mkdir rather than mkdtemp: the published folder should get the usual umask-based mode, not
    # mkdtemp's owner-only 0700 (a cache may be shared with a service user).
    tmp = dest.parent / f"{_prefix(dest, 'building')}{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        build(tmp)
        if not is_complete(tmp):
            raise RuntimeError(f"building {dest} produced an incomplete result")
        _publish(tmp, dest, is_complete)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # already gone when the rename succeeded
    return dest


def _publish(tmp: Path, dest: Path, is_complete: Callable[[Path], bool]) -> None:
    try:
        # Atomic; refuses to replace a non-empty directory, which is what makes races safe.
        os.rename(tmp, dest)
        return
    except OSError:
        if is_complete(dest):
            return  # another process published first; its result is as good as ours
    # dest exists but is stale or broken: move it aside, then publish.
    trash = Path(tempfile.mkdtemp(prefix=_prefix(dest, "stale"), dir=dest.parent))
    try:
        with contextlib.suppress(FileNotFoundError):  # someone else moved it away meanwhile
            os.rename(dest, trash / "old")
        try:
            os.rename(tmp, dest)
        except OSError:
            if not is_complete(dest):
                raise
    finally:
        shutil.rmtree(trash, ignore_errors=True)


def _prefix(dest: Path, kind: str) -> str:
    return f".{dest.name}.{kind}-"


def _remove_abandoned(dest: Path) -> None:
    cutoff = time.time() - _ABANDONED_AFTER_S
    for kind in ("building", "stale"):
        for path in dest.parent.glob(_prefix(dest, kind) + "*"):
            try:
                if path.stat().st_mtime < cutoff:
                    shutil.rmtree(path, ignore_errors=True)
            except FileNotFoundError:
                continue
