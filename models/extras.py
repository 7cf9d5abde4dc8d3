"""Optional packages, the install extra that brings each, and the message a user gets when one
is missing.

The base install (``pip install iotgw``) serves ONNX models; TensorFlow, onnx, SciPy,
scikit-learn and matplotlib come with extras (pyproject.toml). Code that needs one of them
imports it on first use and, when it is missing, says which extra to install instead of showing a
bare ``ModuleNotFoundError``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class OptionalPackage:
    """An importable top-level module that only an extra installs."""

    label: str  # as users know it
    extra: str  # iotgw[<extra>] installs it


OPTIONAL: dict[str, OptionalPackage] = {
    "tensorflow": OptionalPackage("TensorFlow", "tf"),
    "keras": OptionalPackage("TensorFlow (Keras)", "tf"),
    "onnx": OptionalPackage("onnx", "quant"),
    "scipy": OptionalPackage("SciPy", "tune"),
    "sklearn": OptionalPackage("scikit-learn", "tune"),
    "threadpoolctl": OptionalPackage("threadpoolctl", "tune"),
    "matplotlib": OptionalPackage("matplotlib", "sim"),
}

# What the online tuner imports when an agent starts (rrl.tuners.workload, rrl.tuners.gp).
TUNER_MODULES = ("scipy", "sklearn")


def installed(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it (TensorFlow takes seconds)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a half-imported module
        return False


def missing(modules: Iterable[str]) -> list[str]:
    return [m for m in modules if not installed(m)]


def install_hint(modules: Iterable[str]) -> str:
    """``"TensorFlow is not installed: install the iotgw[tf] extra (pip install '.[tf]' in the
    iotgw source folder)"`` for the given module names. (iotgw is installed from its source or a
    wheel built from it, not from an index, so ``pip install 'iotgw[tf]'`` alone finds nothing.)"""
    names = list(modules)
    known = [OPTIONAL.get(m.split(".")[0], OptionalPackage(m, "")) for m in names]
    labels = " and ".join(dict.fromkeys(k.label for k in known))
    extras = ",".join(dict.fromkeys(k.extra for k in known if k.extra))
    verb = "is" if len(known) == 1 else "are"
    fix = (
        f": install the iotgw[{extras}] extra (pip install '.[{extras}]' in the iotgw source "
        "folder)"
        if extras
        else ""
    )
    return f"{labels} {verb} not installed{fix}"


def missing_module_hint(exc: ImportError) -> str | None:
    """The install hint when ``exc`` says that an optional package is not installed; None for
    other import failures (a broken install, a shared library that does not load), whose own
    message is the one to show."""
    top = (exc.name or "").split(".")[0]
    if isinstance(exc, ModuleNotFoundError) and top and not installed(top):
        return install_hint([top])
    return None
