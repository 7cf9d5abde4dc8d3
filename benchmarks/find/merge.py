"""``tuner_find.json`` from parts: results files of ``iotgw bench find`` that each measured some
loads (all of them take about six hours, longer than one sitting), merged into one file whose
summary is the worst case over all of them.

Each load's ratio still rests on the best static measured in the same run as its agent runs,
with that run's noise floor: a load is taken whole from one part, statics and agent runs
together, and a load two parts measured is refused rather than chosen. The parts must have run
the same serving code: the same commit, or commits between which nothing the benchmark runs
changed (the gateway, the agent, the models, the simulator and the benchmark itself; docs,
any ``.md`` file, results files and this module may differ). A part that took its statics
from another file, a quick run, or one run from a checkout with uncommitted changes is
refused.

    python -m benchmarks.find.merge --out benchmarks/results/tuner_find.json PART.json ...
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import write_results
from benchmarks.find import report
from benchmarks.find.plan import NAME

SERVING_CODE = (
    "gateway",
    "rrl",
    "models",
    "device_sim",
    "benchmarks",
    ":(exclude)benchmarks/results",
    ":(exclude)*.md",
    ":(exclude)benchmarks/find/merge.py",  # runs after the measurements, on their files
    "pyproject.toml",
)
"""What a part's figures depend on: a commit that changed none of these measures the same."""

ROOT = Path(__file__).resolve().parent.parent.parent


class MergeRefused(ValueError):
    """Parts that cannot make one results file, with the reason."""


def same_serving_code(first: str, second: str, root: Path = ROOT) -> bool:
    """Whether nothing in ``SERVING_CODE`` differs between two commits of ``root``'s history."""
    if first == second:
        return True
    try:
        diff = subprocess.run(
            ["git", "diff", "--quiet", first, second, "--", *SERVING_CODE],
            cwd=root,
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise MergeRefused(f"cannot compare commits {first} and {second}: {exc}") from exc
    if diff.returncode > 1:
        message = diff.stderr.decode(errors="replace").strip()
        raise MergeRefused(f"cannot compare commits {first} and {second}: {message}")
    return diff.returncode == 0


def _check_part(name: str, doc: dict[str, Any]) -> str:
    """The part's commit, or ``MergeRefused`` saying why it cannot be one."""
    config = doc.get("config", {})
    code = config.get("code")
    if doc.get("benchmark") != NAME:
        raise MergeRefused(f"{name}: not a {NAME} results file")
    if doc.get("quick"):
        raise MergeRefused(f"{name}: a --quick run")
    if config.get("statics_from"):
        raise MergeRefused(f"{name}: its statics came from another run ({config['statics_from']})")
    if not code or code.endswith("+changes") or config.get("code_at_end", code) != code:
        raise MergeRefused(f"{name}: not run from one committed version (code {code!r})")
    return str(code)


def merge(parts: Sequence[tuple[str, dict[str, Any]]], root: Path = ROOT) -> dict[str, Any]:
    """The runs, summary and config of the merged file from ``(name, results document)``
    pairs; ``MergeRefused`` when they are not parts of one measurement."""
    if not parts:
        raise MergeRefused("no parts given")
    codes = [_check_part(name, doc) for name, doc in parts]
    for (name, _), code in zip(parts[1:], codes[1:], strict=True):
        if not same_serving_code(codes[0], code, root):
            raise MergeRefused(f"{name}: ran {code}, whose serving code differs from {codes[0]}")
    statics: dict[str, dict[str, Any]] = {}
    agents: list[dict[str, Any]] = []
    taken: dict[tuple[str, str], str] = {}  # (model, load) -> the part it came from
    for name, doc in parts:
        for load_key in _loads_of(doc):
            if load_key in taken:
                model, load = load_key
                raise MergeRefused(f"{model} {load}: measured by both {taken[load_key]} and {name}")
            taken[load_key] = name
        for run in doc["runs"]:
            if run["kind"] == "static":
                _add_static(statics, run, name)
            else:
                agents.append({**run, "part": name})
    runs = [*statics.values(), *agents]
    return {
        "runs": runs,
        "summary": report.summarize(runs),
        "config": {
            "code": codes[0],
            "merged_from": [
                {
                    "file": name,
                    "code": code,
                    "created": doc.get("created"),
                    "machine": doc.get("machine"),
                    "plan": doc["config"].get("plan"),
                }
                for (name, doc), code in zip(parts, codes, strict=True)
            ],
            **{k: v for k, v in parts[0][1]["config"].items() if k in ("client", "agent")},
        },
    }


def _loads_of(doc: dict[str, Any]) -> set[tuple[str, str]]:
    """The (model, load) pairs a part measured: its statics' loads and its agent runs'."""
    out = {(r["model"], r["load"]) for r in doc["runs"] if r["kind"] == "agent"}
    for r in doc["runs"]:
        if r["kind"] == "static":
            out.update((r["model"], load) for load in r["loads"])
    return out


def _add_static(statics: dict[str, dict[str, Any]], run: dict[str, Any], part: str) -> None:
    """One model's statics across parts: each load's finalist rows and best static as its part
    measured them (with that part's screening of the load, the third run of its floor), and
    each part's screening and capacities whole under ``parts``."""
    empty: dict[str, Any] = {"loads": {}, "best": {}, "screened": {}, "parts": []}
    merged = statics.setdefault(run["model"], {"model": run["model"], "kind": "static", **empty})
    merged["loads"].update(run["loads"])
    merged["best"].update(run["best"])
    screened = run.get("screened", {})
    merged["screened"].update({load: screened[load] for load in run["loads"] if load in screened})
    whole = {k: v for k, v in run.items() if k not in ("model", "kind", "loads", "best")}
    merged["parts"].append({"file": part, "measured_loads": sorted(run["loads"]), **whole})


def cli(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.find.merge", description=__doc__)
    p.add_argument("parts", nargs="+", type=Path, help="results files of bench find")
    p.add_argument("--out", type=Path, required=True, help="the merged results file")
    args = p.parse_args(argv)
    parts = [(path.name, json.loads(path.read_text(encoding="utf-8"))) for path in args.parts]
    try:
        merged = merge(parts)
    except MergeRefused as exc:
        p.exit(2, f"not merged: {exc}\n")
    report.print_report(merged["summary"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # Written beside the target first, so an existing tuner_find.json there is replaced only
    # by a whole file and nothing else of that folder is touched.
    with tempfile.TemporaryDirectory(dir=args.out.parent) as tmp:
        written = write_results(
            NAME,
            quick=False,
            out_dir=Path(tmp),
            machine=parts[0][1].get("machine", {}),
            summary=merged["summary"],
            runs=merged["runs"],
            config=merged["config"],
            created=min(str(doc.get("created", "")) for _, doc in parts),
        )
        written.replace(args.out)
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(cli())
