"""The committed train report is what the committed code draws from the committed results file,
and ``iotgw train --report --from-results`` draws it again without training."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gateway.cli import main as iotgw
from models.reporting import RESULTS_DIR
from models.train.report_pages import chart_names, load_results, markdown

COMMITTED = RESULTS_DIR / "train.json"


def test_the_committed_page_is_drawn_from_the_committed_results() -> None:
    page = (RESULTS_DIR / "train.md").read_text(encoding="utf-8")
    assert page == markdown(load_results(COMMITTED), COMMITTED.name)
    assert "{'" not in page  # tables, never a raw Python dict
    for key in load_results(COMMITTED)["summary"]:
        assert f"| {key} |" in page
    for chart in chart_names("train"):
        assert f"]({chart})" in page and (RESULTS_DIR / chart).is_file()


def test_from_results_draws_the_page_again_without_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = tmp_path / "train.json"
    shutil.copyfile(COMMITTED, copy)
    assert iotgw(["train", "--report", "--from-results", str(copy)]) == 0
    assert (tmp_path / "train.md").read_text() == (RESULTS_DIR / "train.md").read_text()
    assert sorted(p.name for p in tmp_path.glob("*.png")) == sorted(chart_names("train"))
    assert f"from {copy}" in capsys.readouterr().out


def test_from_results_refuses_other_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "http.json"
    other.write_text(json.dumps({"benchmark": "http"}))
    assert iotgw(["train", "--report", "--from-results", str(other)]) == 2
    assert "not a train results file" in capsys.readouterr().err
    assert iotgw(["train", "--report", "--from-results", str(tmp_path / "none.json")]) == 2
    assert "No such file" in capsys.readouterr().err
    assert iotgw(["train", "--from-results", str(COMMITTED)]) == 2
    assert "--from-results goes with --report" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.md"))
