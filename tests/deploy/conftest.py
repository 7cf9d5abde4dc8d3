"""Paths of the deployment files the tests in this package validate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def load_all(path: Path) -> list[dict[str, Any]]:
    """Every document of a YAML file (empty ones left out)."""
    with path.open(encoding="utf-8") as f:
        return [doc for doc in yaml.safe_load_all(f) if doc]


def load_one(path: Path) -> dict[str, Any]:
    (doc,) = load_all(path)
    return doc
