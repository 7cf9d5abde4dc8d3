"""The GPU benchmark from start to end: per side (cuda, then cpu), where the models run, then
the HTTP and quantization benchmarks in processes of their own; the results written."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import BenchRun, print_summary, python_argv, results_path
from benchmarks.gpu.report import summarize

NAME = "gpu"
# The side and what its processes' environment adds: the cpu side hides the GPU.
SIDES: tuple[tuple[str, Mapping[str, str]], ...] = (
    ("cuda", {}),
    ("cpu", {"CUDA_VISIBLE_DEVICES": ""}),
)
EXPECTED_DEVICE = {"cuda": "cuda:0", "cpu": "cpu"}
# Where the models run is asked of one model per backend: ONNX and a TensorFlow checkpoint
# (a checkpoint needs no TensorFlow to write, so this process never starts one on the GPU).
PROBE_MODELS = ("vision_cnn", "sensor_mlp_int8_tf")
BENCHMARKS = ("http", "quant")


@dataclass(frozen=True, slots=True)
class Limits:
    """Seconds each child process may take before it is stopped and the run fails."""

    doctor_s: float
    benchmark_s: float


QUICK = Limits(doctor_s=240, benchmark_s=420)
FULL = Limits(doctor_s=240, benchmark_s=3600)


class GpuBenchError(RuntimeError):
    """A side that cannot be measured as intended, with the reason."""


def probe_repository(dest: Path) -> Path:
    from models.demo import DEMO_MODELS, VERSION, write_model_version

    for demo in DEMO_MODELS:
        if demo.name in PROBE_MODELS:
            write_model_version(demo, dest / demo.name / str(VERSION))
    return dest


def _child(argv: list[str], env: Mapping[str, str], timeout_s: float, log: Path) -> str:
    """Run ``argv`` with ``env`` added; its output goes to ``log`` and is returned. Fails with
    the output's tail when it exits non-zero or outlives ``timeout_s``."""
    try:
        done = subprocess.run(
            argv,
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout if isinstance(exc.stdout, str) else (exc.stdout or b"").decode()
        log.write_text(out)
        raise GpuBenchError(
            f"{' '.join(argv[2:4])} ran past {timeout_s:g} s:\n{out[-3000:]}"
        ) from exc
    log.write_text(done.stdout)
    if done.returncode != 0:
        raise GpuBenchError(
            f"{' '.join(argv[2:4])} exited with {done.returncode}:\n{done.stdout[-3000:]}"
        )
    return done.stdout


def placement(
    side: str, env: Mapping[str, str], repo: Path, work: Path, limit_s: float
) -> list[dict[str, Any]]:
    """``iotgw doctor --load``'s rows for the probe repository on ``side``; raises when a model
    is not where the side needs it."""
    argv = python_argv("gateway.cli", "doctor", "--json", "--load", "--model-repo", str(repo))
    cache = {"IOTGW_SERVING__CACHE_DIR": str(work / f"cache-{side}")}
    out = _child(argv, {**env, **cache}, limit_s, work / f"doctor-{side}.log")
    rows: list[dict[str, Any]] = json.loads(out[out.index("{") :])["models"]
    check_placement(side, rows)
    return rows


def check_placement(side: str, rows: list[dict[str, Any]]) -> None:
    """Every probe model READY on the side's device, else ``GpuBenchError`` naming each one
    that is not and why."""
    want = EXPECTED_DEVICE[side]
    found = {row["model"] for row in rows}
    if found != set(PROBE_MODELS):
        raise GpuBenchError(f"{side} side: doctor reported {sorted(found)}, not {PROBE_MODELS}")
    wrong = [
        f"{row['model']} ({row['runtime']}): {row['state']} on {row.get('device', '-')}, "
        f"{row.get('reason', '')}"
        for row in rows
        if row["state"] != "READY" or row.get("device") != want
    ]
    if wrong:
        raise GpuBenchError(f"{side} side needs every model on {want}: " + "; ".join(wrong))


def measure_side(
    side: str,
    env: Mapping[str, str],
    quick: bool,
    work: Path,
    limits: Limits,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """One side: where the models run, then each benchmark; its entry of the results."""
    repo = probe_repository(work / "probe-repo")
    log(f"{side}: where the models run (iotgw doctor --load, {dict(env) or 'GPU visible'})")
    rows = placement(side, env, repo, work, limits.doctor_s)
    entry: dict[str, Any] = {"figure": "side", "side": side, "env": dict(env), "placement": rows}
    for name in BENCHMARKS:
        out_dir = work / side
        log(f"{side}: iotgw bench {name}{' --quick' if quick else ''}")
        args = ["--out", str(out_dir), *(["--quick"] if quick else [])]
        _child(
            python_argv(f"benchmarks.{name}", *args),
            env,
            limits.benchmark_s,
            work / f"{name}-{side}.log",
        )
        doc = json.loads(results_path(name, quick=quick, out_dir=out_dir).read_text())
        entry[name] = {"summary": doc["summary"], "machine": doc["machine"], "runs": doc["runs"]}
    return entry


def nvidia_gpus() -> list[str]:
    """``nvidia-smi -L``'s lines (empty without a GPU): the machine's GPU, for the results."""
    try:
        done = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line for line in done.stdout.splitlines() if line.startswith("GPU ")]


def run(quick: bool, out_dir: Path | None) -> Path:
    record = BenchRun(NAME, quick, out_dir)
    record.machine["gpus"] = nvidia_gpus()
    limits = QUICK if quick else FULL
    sides: dict[str, dict[str, Any]] = {}
    with record.workdir() as work:
        for side, env in SIDES:
            sides[side] = measure_side(side, env, quick, work / side, limits, record.log)
    summary = summarize(sides)
    print_summary(summary)
    config = {
        "sides": {side: dict(env) for side, env in SIDES},
        "benchmarks": list(BENCHMARKS),
        "probe_models": list(PROBE_MODELS),
        "child_limits_s": {"doctor": limits.doctor_s, "benchmark": limits.benchmark_s},
        "wall_s": record.wall_s(),
    }
    return record.write(summary=summary, runs=list(sides.values()), config=config)


def main(quick: bool = False, out_dir: Path | None = None) -> int:
    try:
        run(quick, out_dir)
    except GpuBenchError as exc:
        print(f"iotgw bench gpu: {exc}")
        return 1
    return 0
