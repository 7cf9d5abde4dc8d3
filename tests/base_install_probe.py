"""Imports every module of the installed project and prints, as one JSON object, which
imported and which could not, and on what.

Run by the base install's own interpreter, in isolated mode and outside the checkout
(``python -I tests/base_install_probe.py``: tests/test_install_profiles.py), so what it imports is
the installed copy with only the base dependencies beside it. It imports nothing of ``tests``.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import traceback
from pathlib import Path

PACKAGES = ("gateway", "models", "rrl", "device_sim", "benchmarks")


def module_names(package: str) -> list[str]:
    """Every module of ``package`` as installed (``__main__`` modules left out: importing one
    runs its command)."""
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.submodule_search_locations, package
    root = Path(next(iter(spec.submodule_search_locations)))
    names = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def main() -> int:
    imported: list[str] = []
    missing: dict[str, str] = {}  # module -> the top-level package it could not import
    errors: dict[str, str] = {}  # module -> any other failure, with its traceback
    for package in PACKAGES:
        for name in module_names(package):
            try:
                importlib.import_module(name)
            except ImportError as exc:
                # A module may re-raise the missing package with a hint (its extra) instead.
                cause = exc if isinstance(exc, ModuleNotFoundError) else exc.__cause__
                if isinstance(cause, ModuleNotFoundError) and cause.name:
                    missing[name] = cause.name.split(".")[0]
                else:
                    errors[name] = traceback.format_exc(limit=-3)
            except Exception:
                errors[name] = traceback.format_exc(limit=-3)
            else:
                imported.append(name)
    json.dump({"imported": imported, "missing": missing, "errors": errors}, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
