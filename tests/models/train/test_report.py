"""The quick report runs end to end and writes every summary key, the table and the plots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.cli import main as iotgw

SUMMARY_KEYS = {
    "acc_fp32",
    "acc_int8",
    "acc_int4",
    "acc_int2",
    "acc_ptq_int4",
    "acc_ptq_int2",
    "simigrad_acc",
    "fixed_small_acc",
    "simigrad_mean_batch_ratio",
    "traffic_ratio",
}
TRAINED_ACCURACIES = (
    "acc_fp32",
    "acc_int8",
    "acc_int4",
    "acc_int2",
    "simigrad_acc",
    "fixed_small_acc",
)
CHANCE = 1 / 10  # ten digit classes


@pytest.mark.slow  # five studies of real training runs: 10-20 s
def test_quick_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert iotgw(["train", "--report", "--quick", "--results-dir", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "train.quick.json").read_text())
    assert doc["benchmark"] == "train" and doc["quick"] is True
    assert set(doc["summary"]) >= SUMMARY_KEYS
    for key in SUMMARY_KEYS - {"simigrad_mean_batch_ratio", "traffic_ratio"}:
        assert 0.0 <= doc["summary"][key] <= 1.0
    # Even a few steps learn: every model trained (at any width, with or without SimiGrad)
    # beats guessing among the ten digits by a wide margin. (Post-training quantization to
    # 2 bits may well fall to chance: that is what the study shows.)
    for key in TRAINED_ACCURACIES:
        assert doc["summary"][key] > 2 * CHANCE, (key, doc["summary"][key])
    assert 0.0 < doc["summary"]["traffic_ratio"] < 1.0
    assert (tmp_path / "train.quick.md").read_text().count("|") > 20
    assert len(list(tmp_path.glob("train.quick_*.png"))) == 4
    # Quick accuracies come with the caveat that they are not the paper figures, on the
    # console and in the Markdown, which holds tables, never a raw Python dict.
    markdown = (tmp_path / "train.quick.md").read_text()
    assert (
        "not the paper figures" in markdown and "not the paper figures" in capsys.readouterr().out
    )
    assert "{'" not in markdown and "| acc_int8 |" in markdown
