"""Paths of the deployment files the tests in this package validate, the validators' programs
and what a model parse lost of a document."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def load_all(path: Path) -> list[dict[str, Any]]:
    """Every document of a YAML file (empty ones left out)."""
    with path.open(encoding="utf-8") as f:
        return [doc for doc in yaml.safe_load_all(f) if doc]


def load_one(path: Path) -> dict[str, Any]:
    (doc,) = load_all(path)
    return doc


def program(name: str) -> str:
    """A validator's executable: the virtual environment's (where the test extra's wheels and
    the test command put them), else one on the PATH. Missing fails, never skips."""
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed; ./scripts/test.sh installs it", pytrace=False)
    return found


def lost(original: Any, parsed: Any, path: str = "") -> list[str]:
    """Where ``parsed`` (a schema model's serialisation of ``original``) lacks or changed
    something of ``original``: a key the model does not know is dropped by its parser, so it
    shows up here. What the model adds (its defaults) is not a loss."""
    if isinstance(original, dict) and isinstance(parsed, dict):
        losses: list[str] = []
        for key, value in original.items():
            where = f"{path}/{key}"
            if key in parsed:
                losses += lost(value, parsed[key], where)
            else:
                losses.append(f"{where}: not in the schema")
        return losses
    if isinstance(original, list) and isinstance(parsed, list) and len(original) == len(parsed):
        return [
            loss
            for i, (a, b) in enumerate(zip(original, parsed, strict=True))
            for loss in lost(a, b, f"{path}/{i}")
        ]
    return [] if original == parsed else [f"{path}: {original!r} became {parsed!r}"]
