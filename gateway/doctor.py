"""``iotgw doctor``: what this install can run on, and where each model of a repository will run
and why.

It asks the libraries what they report (ONNX Runtime's providers, TensorFlow's devices, the CUDA
libraries the loader finds) and runs the backends' own device decision
(``models.backends.devices``) on it, so what it prints is what ``iotgw serve`` will do. With
``--load`` it opens one session per model, which also shows a GPU that fails to initialise.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.metadata
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from gateway.logs import quiet_libraries
from models.backends import load_runtime
from models.backends.devices import Placement
from models.extras import install_hint, installed, missing_module_hint
from models.repository import (
    BrokenVersion,
    ModelVersion,
    RepositoryError,
    checkpoint_repository,
    scan_repository,
)
from models.runtime import ModelLoadError, Threads

# soname -> what it is. CUDA 12 and cuDNN 9: what onnxruntime-gpu < 1.27 and TensorFlow 2.21 load.
CUDA_LIBRARIES = {
    "libcuda.so.1": "NVIDIA driver",
    "libcudart.so.12": "CUDA 12 runtime",
    "libcublas.so.12": "cuBLAS",
    "libcublasLt.so.12": "cuBLASLt",
    "libcufft.so.11": "cuFFT",
    "libcurand.so.10": "cuRAND",
    "libcudnn.so.9": "cuDNN 9",
}
_RUNTIME_MODULE = {"onnxruntime": "onnxruntime", "tensorflow": "tensorflow"}


def distribution_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def onnxruntime_section() -> dict[str, Any]:
    if not installed("onnxruntime"):
        return {"installed": False, "note": install_hint(["onnxruntime"])}
    import onnxruntime as ort

    from models.backends import onnx_backend

    cpu, gpu = distribution_version("onnxruntime"), distribution_version("onnxruntime-gpu")
    section: dict[str, Any] = {
        "installed": True,
        "version": ort.__version__,
        "packages": {"onnxruntime": cpu, "onnxruntime-gpu": gpu},
        "available_providers": ort.get_available_providers(),
        "will_use": onnx_backend.choose_providers(),
        "placement": _placement(onnx_backend.expected_placement()),
    }
    if cpu and gpu:
        section["problem"] = (
            "onnxruntime and onnxruntime-gpu are both installed and share one package folder; "
            "keep only the GPU build: pip uninstall -y onnxruntime onnxruntime-gpu && "
            f"pip install 'onnxruntime-gpu=={gpu}'"
        )
    return section


def tensorflow_section() -> dict[str, Any]:
    if not installed("tensorflow"):
        return {"installed": False, "note": install_hint(["tensorflow"])}
    # Through the backend: it sets TensorFlow's environment before the first import.
    from models.backends import tf_backend

    return {
        "installed": True,
        **tf_backend.install_info(),
        "placement": _placement(tf_backend.expected_placement()),
    }


def cuda_section() -> dict[str, Any]:
    libraries = {soname: find_library(soname) for soname in CUDA_LIBRARIES}
    return {"nvidia_smi": nvidia_smi(), "libraries": libraries}


def find_library(soname: str) -> str | None:
    """Where ``soname`` is found: a path in an nvidia-* wheel (what iotgw[gpu] installs), "system
    loader" when the dynamic loader finds it (ldconfig, LD_LIBRARY_PATH), or None."""
    for folder in _nvidia_wheel_libs():
        if (folder / soname).exists():
            return str(folder / soname)
    try:
        ctypes.CDLL(soname)
    except OSError:
        return None
    return "system loader"


def _nvidia_wheel_libs() -> list[Path]:
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    roots = list(spec.submodule_search_locations or []) if spec else []
    return sorted(p for root in roots for p in Path(root).glob("*/lib") if p.is_dir())


def nvidia_smi() -> str:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return "not found (no NVIDIA driver on this machine, or not in the container)"
    query = [exe, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
    try:
        done = subprocess.run(query, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"failed: {exc}"
    return done.stdout.strip() or f"failed: {done.stderr.strip()}"


def _placement(p: Placement) -> dict[str, str]:
    return {"device": p.device, "engine": p.engine, "reason": p.reason}


# -- models ---------------------------------------------------------------------------------------


def model_rows(
    repo: Path, placements: dict[str, dict[str, str]], *, load: bool
) -> list[dict[str, Any]]:
    """One row per model version: where it will run and why, or why it cannot be served.
    ``placements``: the expected placement per runtime (from the sections above)."""
    rows = []
    for entry in scan_repository(repo):
        row: dict[str, Any] = {"model": entry.name, "version": entry.version}
        if isinstance(entry, BrokenVersion):
            rows.append({**row, "state": "UNAVAILABLE", "reason": entry.reason})
            continue
        row["runtime"] = entry.config.runtime
        absent = _missing_for(entry)
        if absent:
            rows.append({**row, "state": "UNAVAILABLE", "reason": install_hint(absent)})
        elif load:
            rows.append({**row, **_loaded(entry)})
        else:
            rows.append({**row, "state": "READY", **placements[entry.config.runtime]})
    return rows


def _missing_for(version: ModelVersion) -> list[str]:
    """Optional packages this version needs that are not installed."""
    needs = [_RUNTIME_MODULE[version.config.runtime]]
    if version.config.runtime == "onnxruntime" and version.config.format == "checkpoint":
        needs.append("onnx")  # builds the checkpoint's graph at load
    return [m for m in needs if not installed(m)]


def _loaded(version: ModelVersion) -> dict[str, Any]:
    """Open one session (one thread each way) and report where it really runs."""
    try:
        runtime = load_runtime(version, Threads(1, 1))
    except ModelLoadError as exc:
        return {"state": "UNAVAILABLE", "reason": str(exc)}
    except ImportError as exc:
        return {"state": "UNAVAILABLE", "reason": missing_module_hint(exc) or str(exc)}
    try:
        placement = getattr(runtime, "placement", None)
        if isinstance(placement, Placement):
            return {"state": "READY", **_placement(placement)}
        return {"state": "READY", "device": runtime.device, "engine": "", "reason": ""}
    finally:
        runtime.close()


# -- the command ----------------------------------------------------------------------------------


def default_repository(cache_dir: Path) -> Path | None:
    """The bundled demo repository when it has been built (``iotgw serve`` builds it)."""
    root = cache_dir / "demo-repo-v1"
    return root if (root / "MANIFEST.json").is_file() else None


def build_report(repo: Path | None, *, load: bool) -> dict[str, Any]:
    ort_section, tf_section = onnxruntime_section(), tensorflow_section()
    placements = {
        "onnxruntime": ort_section.get("placement", {}),
        "tensorflow": tf_section.get("placement", {}),
    }
    report: dict[str, Any] = {
        "python": sys.version.split()[0],
        "onnxruntime": ort_section,
        "tensorflow": tf_section,
        "cuda": cuda_section(),
        "repository": str(repo) if repo else None,
        "models": [],
    }
    if repo is None:
        report["repository_note"] = (
            "the bundled demo repository is not built yet (iotgw serve builds it); "
            "give --model-repo"
        )
        return report
    try:
        report["models"] = model_rows(repo, placements, load=load)
    except RepositoryError as exc:
        report["repository_note"] = str(exc)
    return report


def render(report: dict[str, Any]) -> str:
    lines = [f"Python {report['python']}"]
    lines += _render_runtime("ONNX Runtime", report["onnxruntime"])
    lines += _render_runtime("TensorFlow", report["tensorflow"])
    cuda = report["cuda"]
    lines.append("CUDA")
    lines.append(f"  nvidia-smi: {cuda['nvidia_smi']}")
    for soname, where in cuda["libraries"].items():
        lines.append(f"  {soname} ({CUDA_LIBRARIES[soname]}): {where or 'missing'}")
    lines.append(f"Models in {report['repository'] or '(no repository)'}")
    if "repository_note" in report:
        lines.append(f"  {report['repository_note']}")
    for row in report["models"]:
        lines.append(f"  {_render_model(row)}")
    return "\n".join(lines)


def _render_runtime(title: str, section: dict[str, Any]) -> list[str]:
    if not section["installed"]:
        return [f"{title}: {section['note']}"]
    lines = [f"{title} {section['version']}"]
    if "available_providers" in section:
        lines.append(f"  available providers: {', '.join(section['available_providers'])}")
        lines.append(f"  will use: {', '.join(section['will_use'])}")
    if "devices" in section:
        cuda = "yes" if section["built_with_cuda"] else "no"
        lines.append(f"  built with CUDA: {cuda}; devices: {', '.join(section['devices'])}")
    placement = section["placement"]
    lines.append(f"  runs on {placement['device']}: {placement['reason']}")
    if "problem" in section:
        lines.append(f"  PROBLEM: {section['problem']}")
    return lines


def _render_model(row: dict[str, Any]) -> str:
    name = f"{row['model']} v{row['version']}"
    if row["state"] != "READY":
        return f"{name}: {row['state']} ({row['reason']})"
    why = f" ({row['reason']})" if row.get("reason") else ""
    return f"{name}: {row['runtime']} {row['engine'] or row['device']}{why}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="iotgw doctor",
        description="Show the execution providers and devices this install finds (ONNX Runtime, "
        "TensorFlow, CUDA libraries) and where each model of the repository will run, and why.",
    )
    parser.add_argument(
        "--model-repo",
        type=Path,
        help="model repository, or one checkpoint file as iotgw serve takes it (default: "
        "serving.model_repo, else the bundled demo if built)",
    )
    parser.add_argument("--config", type=Path, help="TOML settings file, as for iotgw serve")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--load", action="store_true", help="open one session per model (shows GPU fallbacks)"
    )
    args = parser.parse_args(argv)
    # The report is the output: TensorFlow's import banners (and its warnings) are not.
    quiet_libraries()
    from gateway.settings.schema import GatewaySettings

    serving = GatewaySettings.load(args.config).serving
    repo = args.model_repo or serving.model_repo or default_repository(serving.cache_dir)
    if repo is not None and repo.is_file():  # one checkpoint, served as iotgw serve serves it
        try:
            repo = checkpoint_repository(repo, serving.cache_dir)
        except RepositoryError as exc:
            print(f"iotgw doctor: {exc}", file=sys.stderr)
            return 2
    report = build_report(repo, load=args.load)
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0
