"""docs/settings.md lists every settings key with its type and default exactly as the settings
models declare them (it is generated from them), and what it documents is what the settings
loader accepts."""

from __future__ import annotations

import re
from pathlib import Path

from gateway.settings.schema import GatewaySettings
from tests.docs.settings_reference import PAGE, render


def test_the_page_matches_the_settings_models() -> None:
    assert PAGE.read_text(encoding="utf-8") == render(), (
        "docs/settings.md is out of date: run .venv/bin/python -m tests.docs.settings_reference"
    )


def test_every_documented_section_key_loads_from_a_toml_file(tmp_path: Path) -> None:
    """Each key of the gateway's tables, written with its documented default, is accepted."""
    text = PAGE.read_text(encoding="utf-8").split("## A model version")[0]
    lines: list[str] = []
    for table in re.finditer(r"### `\[(\w+)\]`\n\n(.*?)(?:\n\n|\Z)", text, re.S):
        lines.append(f"[{table.group(1)}]")
        for row in re.finditer(r"^\| `(\w+)` \| [^|]* \| `([^`]*)` \|", table.group(2), re.M):
            key, default = row.groups()
            if not default.startswith("~"):
                lines.append(f"{key} = {default}")
    toml = tmp_path / "settings.toml"
    toml.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert len(lines) > 40
    assert GatewaySettings.load(toml) == GatewaySettings.load()
