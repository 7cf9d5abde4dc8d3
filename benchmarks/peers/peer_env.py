"""Each peer (MLServer, Triton) in its own virtual environment under the cache, installed once
and reused.

An environment lives in ``$IOTGW_CACHE_DIR/<peer>-<version>-ort-<version>-py<major><minor>``
(``~/.cache/iotgw/...`` when the variable is unset), next to a wheelhouse of every wheel it was
built from. Three cases:

1. The environment is complete (its stamp names the same requirements): used as it is; no
   network, no pip.
2. It is missing or incomplete, but the wheelhouse is complete: rebuilt from the wheelhouse with
   ``uv pip install --no-index`` (offline).
3. Neither: the wheels are downloaded first (``pip download``, the registry pip is configured
   with), then case 2. When that fails, ``PeerUnavailable`` says what is missing and why.

uv makes and fills the environments (the [bench] extra installs it): the same wheels pip would
install, unpacked in parallel into the environment from a cache beside it, in 2.5 s where pip
took 17-27 s an environment on two cores. pip still downloads, since uv has no command that only
fetches wheels into a folder.

Two benchmark runs (or a run and a test) building at once take turns on a lock file.
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from uv import find_uv_bin

MLSERVER_VERSION = "1.7.1"
# MLServer 1.7.1 pins no uvloop; uvloop 0.22 made ``get_event_loop`` raise where no loop is set,
# which MLServer's inference worker calls at start-up, so every worker dies with a newer one.
# 0.21.0 is the release that was current when MLServer 1.7.1 came out.
UVLOOP_PIN = "uvloop==0.21.0"
# PyTriton 0.7.0 bundles tritonserver 2.51 (its HTTP/gRPC front ends, dynamic batcher and Python
# backend) and needs NumPy 1.x.
PYTRITON_VERSION = "0.7.0"
NUMPY_PIN = "numpy<2"
STAMP = "iotgw-peers.json"
PIP_TIMEOUT_S = 900.0


class PeerUnavailable(RuntimeError):
    """A peer cannot be installed here; the message says what is missing and why."""


@dataclass(frozen=True, slots=True)
class PeerEnv:
    root: Path  # the cache folder: venv/ and wheels/
    requirements: tuple[str, ...]
    label: str = "MLServer"  # the peer's name, in what is logged and raised

    @property
    def venv(self) -> Path:
        return self.root / "venv"

    @property
    def wheels(self) -> Path:
        return self.root / "wheels"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def mlserver(self) -> Path:
        return self.venv / "bin" / "mlserver"


def default_cache_dir(environ: dict[str, str] | None = None) -> Path:
    """``$IOTGW_CACHE_DIR``, or ``~/.cache/iotgw`` when it is unset (as ``models.demo``)."""
    cache = (os.environ if environ is None else environ).get("IOTGW_CACHE_DIR")
    return Path(cache) if cache else Path.home() / ".cache" / "iotgw"


def _ort_version() -> str:
    """The ONNX Runtime this process serves with: every peer gets the same, so that all the
    servers run the same runtime."""
    return importlib.metadata.version("onnxruntime")


def _env_root(cache_dir: Path | None, peer: str) -> Path:
    py = f"py{sys.version_info.major}{sys.version_info.minor}"
    return (cache_dir or default_cache_dir()) / f"{peer}-ort-{_ort_version()}-{py}"


def mlserver_requirements() -> tuple[str, ...]:
    """MLServer pinned, and this process's ONNX Runtime."""
    return (f"mlserver=={MLSERVER_VERSION}", f"onnxruntime=={_ort_version()}", UVLOOP_PIN)


def triton_requirements() -> tuple[str, ...]:
    """PyTriton pinned (NumPy 1.x, which it needs), and this process's ONNX Runtime."""
    ort = f"onnxruntime=={_ort_version()}"
    return (f"nvidia-pytriton=={PYTRITON_VERSION}", NUMPY_PIN, ort)


def mlserver_env(cache_dir: Path | None = None) -> PeerEnv:
    """Where MLServer's environment for this interpreter and ONNX Runtime lives (nothing is
    built)."""
    root = _env_root(cache_dir, f"mlserver-{MLSERVER_VERSION}")
    return PeerEnv(root, mlserver_requirements(), "MLServer")


def triton_env(cache_dir: Path | None = None) -> PeerEnv:
    """Where Triton's (PyTriton's) environment lives (nothing is built)."""
    root = _env_root(cache_dir, f"pytriton-{PYTRITON_VERSION}")
    return PeerEnv(root, triton_requirements(), "Triton")


def ensure_mlserver(cache_dir: Path | None = None, log: Callable[[str], None] = print) -> PeerEnv:
    """MLServer's environment, built first if it is not complete (see the module's
    docstring)."""
    return ensure_env(mlserver_env(cache_dir), log)


def ensure_triton(cache_dir: Path | None = None, log: Callable[[str], None] = print) -> PeerEnv:
    """Triton's environment, built first if it is not complete."""
    return ensure_env(triton_env(cache_dir), log)


def interpreter_libdir() -> str:
    """The folder of the shared ``libpython`` the environments' interpreter links: Triton's
    Python backend stub loads ``libpython3.X.so`` from the dynamic loader's path, so it goes on
    the Triton process's ``LD_LIBRARY_PATH``. The venvs are made from this process's base
    interpreter (``_build_venv``), whose build settings this is."""
    return str(sysconfig.get_config_var("LIBDIR"))


def ensure_env(env: PeerEnv, log: Callable[[str], None] = print) -> PeerEnv:
    """``env`` complete: as it is, else rebuilt from its wheelhouse, downloaded first if that
    is not complete either."""
    if _complete(env):
        return env
    env.root.mkdir(parents=True, exist_ok=True)
    with _locked(env.root / ".lock"):
        if _complete(env):  # built by whoever held the lock
            return env
        if not _stamped(env.wheels, env.requirements):
            log(f"downloading {' '.join(env.requirements)} into {env.wheels}")
            _download(env)
        log(f"building {env.label}'s environment {env.venv} (offline, from {env.wheels})")
        _build_venv(env)
    return env


def _complete(env: PeerEnv) -> bool:
    """Built for these requirements, and its interpreter still there."""
    return _stamped(env.venv, env.requirements) and env.python.exists()


def _stamped(folder: Path, reqs: tuple[str, ...]) -> bool:
    try:
        return bool(json.loads((folder / STAMP).read_text())["requirements"] == list(reqs))
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _stamp(folder: Path, reqs: tuple[str, ...]) -> None:
    (folder / STAMP).write_text(json.dumps({"requirements": list(reqs)}))


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _installer(argv: list[str], what: str, env: PeerEnv) -> None:
    """Run pip or uv; on failure raise ``PeerUnavailable`` naming what is missing and the
    installer's last words."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PeerUnavailable(f"{what} failed: {exc}") from exc
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-6:])
        raise PeerUnavailable(
            f"{what} failed: {' '.join(env.requirements)} are not in the cache "
            f"({env.root}) and could not be installed:\n{tail}"
        )


def _download(env: PeerEnv) -> None:
    """Every wheel the environment needs, into a fresh wheelhouse (moved into place only when
    complete, so an interrupted download is never taken for a wheelhouse)."""
    partial = env.root / "wheels.partial"
    shutil.rmtree(partial, ignore_errors=True)
    argv = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "-q"]
    _installer([*argv, "-d", str(partial), *env.requirements], f"downloading {env.label}", env)
    _stamp(partial, env.requirements)
    shutil.rmtree(env.wheels, ignore_errors=True)
    partial.rename(env.wheels)


def _build_venv(env: PeerEnv) -> None:
    """A fresh virtual environment installed from the wheelhouse only (no index): offline."""
    shutil.rmtree(env.venv, ignore_errors=True)
    uv = find_uv_bin()
    base = getattr(sys, "_base_executable", sys.executable)
    venv = [uv, "venv", "--quiet", "--python", base, str(env.venv)]
    _installer(venv, f"creating {env.label}'s virtual environment", env)
    # The cache beside the environment: on the same file system, so the files are hard links
    # into it rather than copies, and a rebuild after an interrupted one unpacks nothing again.
    argv = [uv, "pip", "install", "--quiet", "--python", str(env.python), "--no-index"]
    argv += ["--cache-dir", str(env.root / "uv-cache"), "--find-links", str(env.wheels)]
    _installer([*argv, *env.requirements], f"installing {env.label} from the wheelhouse", env)
    _stamp(env.venv, env.requirements)
