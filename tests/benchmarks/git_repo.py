"""Real git in a test's own folder: the benchmarks' commit bookkeeping is tested against it."""

from __future__ import annotations

import subprocess
from pathlib import Path


def git(repo: Path, *args: str) -> str:
    """``git args`` in ``repo`` with a throwaway identity; its output, stripped."""
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
