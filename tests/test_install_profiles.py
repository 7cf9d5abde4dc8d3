"""Install profiles: the base install serves ONNX models; TensorFlow, onnx, SciPy, scikit-learn
and matplotlib come with extras, and what needs a missing one says which extra to install.

The base install is checked in a real one: a fresh virtual environment (``python -m venv``) into
which ``pip install`` puts a copy of the checkout without extras, from the package index, once
per module (about 25 s on two cores; pip's own cache keeps the downloads). In it, every module
of the project is imported (those that need an extra must fail on that extra's packages alone),
and ``iotgw serve`` answers over HTTP and MQTT 5. Every import of the project is declared too:
what a module of the base install loads when it is imported is a base requirement (not something
a dependency happens to bring), and every other import is at least an extra's.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib.metadata as md
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.brokers import Broker, free_port, mosquitto
from tests.gateway.helpers import make_repo

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gateway", "models", "rrl", "device_sim", "benchmarks")
SOURCES = ("pyproject.toml", "README.md", *PACKAGES)  # what pip install . builds from
DEADLINE_S = 120.0
# pip's limit, under pytest's 300 s: a stuck install fails with pip's own output.
PIP_TIMEOUT_S = 240.0
TAIL = 4000  # characters of a failed command's output in the failure
# Imported by name but brought by a declared parent, whose own types they are and which pins
# their version (a requirement of ours could only fight that pin): TensorFlow's Keras,
# pydantic's core, aiohttp's header and URL types. Checked against the parent's metadata.
COMES_WITH = {
    "keras": "tensorflow",
    "pydantic_core": "pydantic",
    "multidict": "aiohttp",
    "yarl": "aiohttp",
}
# Run by a peer server's own interpreter, in the environment iotgw bench peers makes for it
# (benchmarks/peers/peer_env.py), never by the project's.
PEER_MODULES = {"benchmarks.peers.mlserver_runtime", "benchmarks.peers.triton_server"}


def _project() -> dict[str, Any]:
    with (ROOT / "pyproject.toml").open("rb") as fh:
        project: dict[str, Any] = tomllib.load(fh)["project"]
    return project


def _applies(requirement: str, machine: str, extra: str = "") -> str | None:
    """The distribution ``requirement`` installs on Linux ``machine``, or None."""
    req = Requirement(requirement)
    env = {k: str(v) for k, v in default_environment().items()}
    env.update(platform_machine=machine, sys_platform="linux", extra=extra)
    if req.marker is None or req.marker.evaluate(env):
        return req.name
    return None


def test_base_dependencies_leave_out_the_heavy_packages() -> None:
    base = {Requirement(r).name for r in _project()["dependencies"]}
    assert {"onnxruntime", "aiohttp", "aiomqtt", "safetensors"} <= base
    heavy = {"tensorflow", "tensorflow-cpu", "onnx", "scipy", "scikit-learn", "matplotlib"}
    assert not base & heavy


@pytest.mark.parametrize(
    ("machine", "wheel"), [("x86_64", "tensorflow-cpu"), ("aarch64", "tensorflow")]
)
def test_tf_extra_picks_a_wheel_that_exists_on_the_machine(machine: str, wheel: str) -> None:
    """tensorflow-cpu has x86_64 wheels only: arm64 (the CPU image on arm64) gets tensorflow."""
    chosen = [_applies(r, machine, "tf") for r in _project()["optional-dependencies"]["tf"]]
    assert [c for c in chosen if c] == [wheel]


def test_gpu_extra_is_one_cuda_for_both_backends() -> None:
    gpu = [Requirement(r) for r in _project()["optional-dependencies"]["gpu"]]
    ort = next(r for r in gpu if r.name == "onnxruntime-gpu")
    # 1.27 and later are CUDA 13 builds; TensorFlow 2.21 loads CUDA 12.
    assert not ort.specifier.contains("1.27.0") and ort.specifier.contains("1.26.0")
    assert {"cuda", "cudnn"} <= ort.extras
    linux_tf = [r for r in gpu if r.name == "tensorflow" and "and-cuda" in r.extras]
    assert linux_tf


def test_test_extra_installs_every_feature() -> None:
    test = [Requirement(r) for r in _project()["optional-dependencies"]["test"]]
    own = next(r for r in test if r.name == "iotgw")
    assert {"demo", "bench"} <= own.extras


# The base install: a fresh virtual environment with the checkout installed without extras.


@dataclass(frozen=True)
class BaseInstall:
    venv: Path
    env: dict[str, str]

    @property
    def iotgw(self) -> str:
        return str(self.venv / "bin" / "iotgw")

    def run(self, argv: list[str], *, cwd: Path, timeout_s: float) -> str:
        """``argv`` in the base install (run from ``cwd``, outside the checkout); its output,
        and the test fails with that output if it exits non-zero or outlives ``timeout_s``."""
        try:
            done = subprocess.run(
                argv,
                cwd=cwd,
                env=self.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            out = exc.output.decode(errors="replace") if exc.output else ""
            pytest.fail(f"{argv} still running after {timeout_s} s:\n{out[-TAIL:]}")
        out = done.stdout.decode(errors="replace")
        if done.returncode != 0:
            pytest.fail(f"{argv} exited with {done.returncode}:\n{out[-TAIL:]}")
        return out


def _copy_checkout(dest: Path) -> None:
    """What ``pip install .`` builds from, as the working tree has it (uncommitted edits
    included), copied so that the build's own folders (build/, *.egg-info) stay out of the
    checkout."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *SOURCES],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():  # a tracked file deleted in the working tree is not built
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)


@pytest.fixture(scope="module")
def base_install(tmp_path_factory: pytest.TempPathFactory) -> BaseInstall:
    folder = tmp_path_factory.mktemp("base-install")
    _copy_checkout(folder / "source")
    # Nothing of the test environment leaks in: no PYTHONPATH, no active virtual environment.
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    install = BaseInstall(folder / "venv", env)
    python = str(install.venv / "bin" / "python")
    install.run([sys.executable, "-m", "venv", str(install.venv)], cwd=folder, timeout_s=60)
    pip = [python, "-m", "pip", "install", "--disable-pip-version-check", "--progress-bar=off"]
    install.run([*pip, str(folder / "source")], cwd=folder, timeout_s=PIP_TIMEOUT_S)
    return install


def _module_file(module: str) -> Path:
    path = ROOT.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _project_modules() -> list[str]:
    modules = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return modules


@dataclass(frozen=True)
class Import:
    """``module`` (the project's) imports the top-level package ``name``; ``at_load``: when
    ``module`` is imported, not in a function, a TYPE_CHECKING block or a try that catches
    ImportError."""

    module: str
    name: str
    at_load: bool


def _catches_import_error(node: ast.Try) -> bool:
    names = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}
    for handler in node.handlers:
        caught = handler.type
        types = caught.elts if isinstance(caught, ast.Tuple) else [caught]
        if caught is None or any(isinstance(t, ast.Name) and t.id in names for t in types):
            return True
    return False


def _third_party_imports(module: str) -> list[Import]:
    found: list[Import] = []

    def visit(node: ast.AST, at_load: bool) -> None:
        if isinstance(node, ast.Import | ast.ImportFrom):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                names = [node.module] if node.module and not node.level else []
            for name in names:
                top = name.split(".")[0]
                if top not in PACKAGES and top not in sys.stdlib_module_names:
                    found.append(Import(module, top, at_load))
            return
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            at_load = False
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.body:
                visit(stmt, False)
            for stmt in node.orelse:
                visit(stmt, at_load)
            return
        elif isinstance(node, ast.Try) and _catches_import_error(node):
            for stmt in node.body:
                visit(stmt, False)
            rest: list[ast.AST] = [*node.handlers, *node.orelse, *node.finalbody]
            for part in rest:
                visit(part, at_load)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, at_load)

    visit(ast.parse(_module_file(module).read_text(encoding="utf-8")), True)
    return found


def _requirement_names(requirements: list[str]) -> set[str]:
    names: set[str] = {canonicalize_name(Requirement(r).name) for r in requirements}
    return names - {"iotgw"}


def _declared() -> tuple[set[str], set[str]]:
    """The distributions the base install declares, and those only an extra declares."""
    project = _project()
    base = _requirement_names(project["dependencies"])
    extras = set().union(*map(_requirement_names, project["optional-dependencies"].values()))
    return base, extras - base


def _distributions(name: str) -> set[str]:
    """The installed distributions that provide the top-level import ``name``."""
    return {canonicalize_name(d) for d in _import_names().get(name, [])}


@functools.cache
def _import_names() -> Mapping[str, list[str]]:
    return md.packages_distributions()


def _undeclared(module: str, name: str, declared: set[str]) -> str | None:
    """Why ``module``'s import of ``name`` is not covered by the distributions ``declared``,
    or None if it is."""
    if module in PEER_MODULES:
        return None
    provided = _distributions(name)
    if provided & declared:
        return None
    parent = COMES_WITH.get(name)
    if parent is not None:
        for dist in _distributions(parent) & declared:
            needs = {canonicalize_name(Requirement(r).name) for r in md.requires(dist) or []}
            if provided & needs:
                return None
        return f"{module}: {name} ({parent} no longer brings it: declare it)"
    return f"{module}: {name} (distribution {sorted(provided) or '?'})"


def test_every_import_of_the_project_is_declared() -> None:
    """Each package the project imports anywhere (a function's lazy import included) is a
    requirement of the base install or of an extra."""
    base, extras = _declared()
    imports = [imp for module in _project_modules() for imp in _third_party_imports(module)]
    assert {"numpy", "aiohttp", "tensorflow", "pwdlib"} <= {imp.name for imp in imports}
    missing = {why for imp in imports if (why := _undeclared(imp.module, imp.name, base | extras))}
    assert not missing, sorted(missing)


@pytest.mark.slow
def test_base_install_imports_the_gateway_and_declares_what_it_loads(
    base_install: BaseInstall, tmp_path: Path
) -> None:
    assert "serve" in base_install.run([base_install.iotgw, "--help"], cwd=tmp_path, timeout_s=60)
    serve_help = base_install.run(
        [base_install.iotgw, "serve", "--help"], cwd=tmp_path, timeout_s=60
    )
    assert "--model-repo" in serve_help
    # Isolated mode (-I): neither the probe's folder (tests/) nor the working directory is on
    # the path, so every import is the installed copy's.
    python = str(base_install.venv / "bin" / "python")
    probe = str(ROOT / "tests" / "base_install_probe.py")
    found = json.loads(base_install.run([python, "-I", probe], cwd=tmp_path, timeout_s=120))
    assert not found["errors"], found["errors"]
    imported: set[str] = set(found["imported"])
    missing: dict[str, str] = found["missing"]
    # Every module was installed (a __main__ is left out: importing it runs its command).
    assert imported | set(missing) == {m for m in _project_modules() if not m.endswith(".__main__")}
    # The gateway is what the base install serves: all of it imports.
    assert not {m for m in missing if m.split(".")[0] == "gateway"}, missing
    base, extras = _declared()
    # Whatever else cannot import waits for an extra's package, or runs in a peer's own
    # environment (iotgw bench peers).
    wrong = {why for module, name in missing.items() if (why := _undeclared(module, name, extras))}
    assert not wrong, sorted(wrong)
    # What the base install loads when it imports its modules is its own requirement, not
    # something a dependency happens to bring today.
    undeclared = {
        why
        for module in imported
        for imp in _third_party_imports(module)
        if imp.at_load and (why := _undeclared(module, imp.name, base))
    }
    assert not undeclared, sorted(undeclared)


@pytest.fixture
def two_runtimes(demo_repo: Path, tmp_path: Path) -> Path:
    """One ONNX model and one TensorFlow model; the TensorFlow one is not required, so the
    gateway is ready without it where TensorFlow is not installed."""
    return make_repo(
        tmp_path / "repo",
        demo_repo,
        {"sensor_mlp": None, "sensor_mlp_tf": {"required": False}},
    )


@contextlib.contextmanager
def _serving(
    install: BaseInstall, repo: Path, folder: Path, broker: str
) -> Iterator[tuple[str, Path]]:
    """``iotgw serve`` of the base install, ready over HTTP and connected to ``broker``."""
    port = free_port()
    log = folder / "serve.log"
    argv = [install.iotgw, "serve", "--model-repo", str(repo), "--cache-dir", str(folder)]
    argv += ["--http-port", str(port), "--broker", broker, "--mqtt-client-id", "base-install"]
    # The tuner on, as by default: without SciPy and scikit-learn it must step aside, not crash.
    env = {**install.env, "IOTGW_TUNER__ENABLED": "true"}
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=folder, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, proc, log)
        yield url, log
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"gateway exited with {proc.returncode}:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=5) as r:
                if r.status == 200 and "MQTT: connected" in log.read_text(errors="replace"):
                    return
        except (urllib.error.HTTPError, OSError):
            pass
        time.sleep(0.1)
    raise AssertionError(f"gateway not ready in {DEADLINE_S} s:\n{log.read_text()}")


def _post(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _settled_index(url: str) -> dict[str, Any]:
    """The repository index once no model is still loading: ready means the gateway serves,
    and a model whose runtime is missing may still be on its way to UNAVAILABLE."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        status, index = _post(f"{url}/v2/repository/index", {})
        assert status == 200, index
        states = {m["name"]: m for m in index}
        if all(m["state"] != "LOADING" for m in index) or time.monotonic() > deadline:
            return states
        time.sleep(0.1)


def _mqtt5_request(broker: Broker, model: str, body: dict[str, Any]) -> dict[str, Any]:
    """One MQTT 5 request and its reply, by Debian's mosquitto_rr (Response Topic; no
    Correlation Data, so the body's ``id`` matches the reply)."""
    rr = shutil.which("mosquitto_rr")
    if rr is None:
        pytest.fail("mosquitto_rr is not installed (the test command installs mosquitto-clients)")
    topic = f"{broker.url}/iotgw/infer/{model}/req/dev1"
    argv = [rr, "-V", "5", "-W", "30", "-L", topic, "-e", f"iotgw/infer/{model}/res/dev1/rr"]
    done = subprocess.run(
        [*argv, "-m", json.dumps(body)], capture_output=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    reply: dict[str, Any] = json.loads(done.stdout)
    return reply


@pytest.mark.slow
def test_base_install_serves_onnx_over_http_and_mqtt5_and_names_the_missing_extras(
    base_install: BaseInstall, two_runtimes: Path, tmp_path: Path
) -> None:
    features = {"name": "features", "datatype": "FP32", "shape": [2, 32], "data": [0.1] * 64}
    with (
        mosquitto(tmp_path) as broker,
        _serving(base_install, two_runtimes, tmp_path, broker.url) as (url, log),
    ):
        states = _settled_index(url)
        assert states["sensor_mlp"]["state"] == "READY"
        tf_model = states["sensor_mlp_tf"]
        assert tf_model["state"] == "UNAVAILABLE"
        assert tf_model["reason"].endswith(
            "TensorFlow is not installed: install the iotgw[tf] extra (pip install '.[tf]' in "
            "the iotgw source folder)"
        )
        status, reply = _post(f"{url}/v2/models/sensor_mlp/infer", {"inputs": [features]})
        assert status == 200 and reply["outputs"][0]["shape"] == [2, 8]
        status, reply = _post(f"{url}/v2/models/sensor_mlp_tf/infer", {"inputs": [features]})
        assert status == 503 and "iotgw[tf]" in json.dumps(reply)
        reply = _mqtt5_request(broker, "sensor_mlp", {"id": "rr-1", "inputs": [features]})
        assert reply["id"] == "rr-1" and reply["outputs"][0]["shape"] == [2, 8]
        reply = _mqtt5_request(broker, "sensor_mlp_tf", {"id": "rr-2", "inputs": [features]})
        assert reply["id"] == "rr-2" and "iotgw[tf]" in json.dumps(reply)
        text = log.read_text()
    assert "tuner: off, serving the configured knobs" in text
    assert "pip install '.[tune]'" in text


@pytest.mark.slow
def test_bundled_demo_without_its_extras_says_which_to_install(
    base_install: BaseInstall, tmp_path: Path
) -> None:
    argv = [base_install.iotgw, "serve", "--cache-dir", str(tmp_path), "--http-port", "0"]
    done = subprocess.run(
        [*argv, "--no-mqtt"],
        cwd=tmp_path,
        env=base_install.env,
        capture_output=True,
        timeout=DEADLINE_S,
        check=False,
    )
    assert done.returncode != 0
    assert "pip install '.[demo]'" in (done.stdout + done.stderr).decode(errors="replace")
