"""``tuner_find.json`` merged from parts (``benchmarks.find.merge``): a real results file with two
loads, split into one part per load and merged back, reads the summary the whole file read; parts
that are not one measurement are refused with the reason; the serving-code check runs real git."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.find import report
from benchmarks.find.merge import MergeRefused, cli, merge, same_serving_code
from tests.benchmarks.git_repo import git

# vision_cnn at 8 and 128 connections, statics and agent runs in one run.
TWO_LOADS = Path(__file__).resolve().parents[2] / "benchmarks/results/tuner_find_run43.json"


def whole() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(TWO_LOADS.read_text(encoding="utf-8"))
    return doc


def part(doc: dict[str, Any], load: str) -> dict[str, Any]:
    """``doc`` as if its run had measured ``load`` alone."""
    out = copy.deepcopy(doc)
    runs = []
    for r in out["runs"]:
        if r["kind"] == "static":
            r["loads"], r["best"] = {load: r["loads"][load]}, {load: r["best"][load]}
            runs.append(r)
        elif r["load"] == load:
            runs.append(r)
    out["runs"] = runs
    return out


def test_a_file_split_by_load_and_merged_back_reads_the_same_summary(tmp_path: Path) -> None:
    doc = whole()
    paths = []
    for load in ("c8", "c128"):
        paths.append(tmp_path / f"{load}.json")
        paths[-1].write_text(json.dumps(part(doc, load)), encoding="utf-8")
    out = tmp_path / "results" / "tuner_find.json"

    assert cli([*map(str, paths), "--out", str(out)]) == 0

    merged = json.loads(out.read_text(encoding="utf-8"))
    assert merged["summary"] == report.summarize(doc["runs"])
    assert merged["summary"]["by_model"]["vision_cnn"].keys() == {"c8", "c128"}
    assert [p["file"] for p in merged["config"]["merged_from"]] == ["c8.json", "c128.json"]
    (static,) = [r for r in merged["runs"] if r["kind"] == "static"]
    assert [p["measured_loads"] for p in static["parts"]] == [["c8"], ["c128"]]
    agents = [r for r in merged["runs"] if r["kind"] == "agent"]
    assert {(r["load"], r["part"]) for r in agents} == {("c8", "c8.json"), ("c128", "c128.json")}
    assert list(tmp_path.joinpath("results").iterdir()) == [out]  # nothing else left there


def test_a_load_measured_by_two_parts_is_refused() -> None:
    doc = whole()
    with pytest.raises(MergeRefused, match=r"vision_cnn c8: measured by both a\.json and b\.json"):
        merge([("a.json", part(doc, "c8")), ("b.json", doc)])


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"quick": True}, "a --quick run"),
        ({"config": {"statics_from": "other.json"}}, "its statics came from another run"),
        ({"config": {"code": "5276c17+changes"}}, "not run from one committed version"),
        ({"config": {"code_at_end": "abcdef0"}}, "not run from one committed version"),
        ({"benchmark": "tuner"}, "not a tuner_find results file"),
    ],
)
def test_a_part_that_is_not_one_committed_full_run_is_refused(
    change: dict[str, Any], reason: str
) -> None:
    doc = whole()
    for key, value in change.items():
        if isinstance(value, dict):
            doc[key].update(value)
        else:
            doc[key] = value
    with pytest.raises(MergeRefused, match=reason):
        merge([("x.json", doc)])


def commit(repo: Path, path: str, text: str) -> str:
    (repo / path).parent.mkdir(parents=True, exist_ok=True)
    (repo / path).write_text(text, encoding="utf-8")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", path)
    return git(repo, "rev-parse", "--short", "HEAD")


def test_commits_that_changed_only_docs_and_results_serve_the_same_code(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q")
    first = commit(tmp_path, "rrl/agent/policy.py", "RULE = 1\n")
    docs = commit(tmp_path, "rrl/README.md", "where each rule lives\n")
    results = commit(tmp_path, "benchmarks/results/tuner_find_run47.json", "{}\n")
    agent = commit(tmp_path, "rrl/agent/policy.py", "RULE = 2\n")

    assert same_serving_code(first, docs, tmp_path)
    assert same_serving_code(first, results, tmp_path)
    assert not same_serving_code(first, agent, tmp_path)
    with pytest.raises(MergeRefused, match="cannot compare commits"):
        same_serving_code(first, "0000000", tmp_path)
