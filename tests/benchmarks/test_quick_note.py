"""A --quick run says, after its figures, that it is not meant to meet the targets: a quick run
printed ``target_met False`` and left the reader to guess whether that was a finding."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.common import BenchRun


@pytest.mark.parametrize("quick", [True, False])
def test_a_quick_run_says_its_targets_are_not_aimed_at(
    quick: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = BenchRun("note", quick, tmp_path, machine={"cpu": "test"})
    path = run.write(summary={"target_met": False}, runs=[], config={})
    out = capsys.readouterr().out
    assert path.is_file() and f"wrote {path}" in out
    assert ("This was a --quick run" in out) is quick
    if quick:
        assert "target_met (or *_met) of False above says nothing" in out
