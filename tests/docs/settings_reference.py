"""docs/settings.md, generated from the settings models so that it cannot drift: every key of
the gateway's TOML file (``iotgw serve --config``) and of a model version's ``config.toml``, with
its type, default and description. ``tests/docs/test_settings_reference.py`` fails when the page
differs from what this renders; regenerate it with

    .venv/bin/python -m tests.docs.settings_reference
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from gateway.settings.cli import flag_forms
from gateway.settings.schema import GatewaySettings
from models.repository import BatchingDefaults, ModelConfig

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "settings.md"

_INTRO = """\
# Settings reference

<!-- Generated from gateway/settings/schema.py and models/repository.py by
     `python -m tests.docs.settings_reference`; tests/docs/test_settings_reference.py checks
     that it matches. Edit the field descriptions there, not this page. -->

The gateway reads its settings once at start, from (highest first) the command line, the
environment and a TOML file given with `iotgw serve --config FILE`. In the file, each section
below is a table and each key is the setting's name, e.g.

```toml
[http]
port = 8081

[mqtt]
embedded_port = 1884       # not "port": an unknown key is refused with its section named
```

The environment variable of a setting is `IOTGW_<SECTION>__<KEY>` in capitals
(`IOTGW_MQTT__EMBEDDED_PORT=1884`); the flag is listed with each key. Lists are TOML arrays in
the file, comma-separated in a flag (`--tune-models a,b`) and JSON in the environment
(`IOTGW_TUNER__MODELS='["a","b"]'`).
"""

_MODEL_INTRO = """\
## A model version's `config.toml`

Each `<repo>/<model>/<version>/` folder holds one (see the README's "Model repository"). Unknown
keys are refused; the version is then listed `UNAVAILABLE` with the reason.
"""


def render() -> str:
    parts = [_INTRO]
    for section, field in GatewaySettings.model_fields.items():
        model = field.annotation
        if isinstance(model, type) and issubclass(model, BaseModel):
            parts.append(_table(f"`[{section}]`", model.model_fields, section=section))
    top = {n: f for n, f in GatewaySettings.model_fields.items() if n in _TOP_LEVEL}
    parts.append(_table("Top level (no table)", top, section=""))
    parts.append(_MODEL_INTRO)
    model_keys = {n: f for n, f in ModelConfig.model_fields.items() if n != "batching"}
    parts.append(_table("Top level", model_keys, section=None))
    parts.append(_table("`[batching]`", _dataclass_fields(BatchingDefaults), section=None))
    return "\n".join(parts)


_TOP_LEVEL = ("log_level", "log_format")


def _dataclass_fields(cls: type) -> dict[str, FieldInfo]:
    """A pydantic-validated dataclass's fields as pydantic reads them (the knobs are one)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    return {
        f.name: FieldInfo.from_annotated_attribute(hints[f.name], f.default)
        for f in dataclasses.fields(cls)
    }


def _table(title: str, fields: dict[str, FieldInfo], *, section: str | None) -> str:
    """One table of keys; ``section`` names the settings section whose flags to list ("" for
    the top level), None for a model's config.toml, which has no flags."""
    columns = ["key", "type", "default", *(["flag"] if section is not None else []), "description"]
    rows = [
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
    ]
    for name, field in fields.items():
        cells = [f"`{name}`", _type(field), _default(field)]
        if section is not None:
            flags = flag_forms(section, name) if section else [f"--{name.replace('_', '-')}"]
            cells.append(" / ".join(f"`{flag}`" for flag in flags))
        cells.append(_cell(field.description or ""))
        rows.append("| " + " | ".join(cells) + " |")
    return f"### {title}\n\n" + "\n".join(rows) + "\n"


def _type(field: FieldInfo) -> str:
    text = _annotation(field.annotation)
    bounds = []
    for meta in field.metadata:
        for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            value = getattr(meta, attr, None)
            if isinstance(meta, annotated_types.BaseMetadata) and value is not None:
                bounds.append(f"{sign} {value:g}")
    return _cell(text + (f" ({', '.join(bounds)})" if bounds else ""))


def _annotation(annotation: Any) -> str:
    if get_origin(annotation) in (Union, types.UnionType):
        inner = [a for a in get_args(annotation) if a is not type(None)]
        return " or ".join(_annotation(a) for a in inner) + (
            ", optional" if type(None) in get_args(annotation) else ""
        )
    if get_origin(annotation) is Literal:
        return "one of " + ", ".join(json.dumps(v) for v in get_args(annotation))
    if get_origin(annotation) is list:
        return "list of " + _annotation(get_args(annotation)[0]) + "s"
    names = {bool: "boolean", int: "integer", float: "number", str: "string", Path: "path"}
    if annotation is SecretStr:
        return "string (secret)"
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        return "set at start (see description)"  # e.g. from the host name: differs per machine
    if field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if value is None:
        return "unset"
    if isinstance(value, BaseModel):
        return "(table)"
    if isinstance(value, Path):  # written relative to the home folder, as on every machine
        return f"`{str(value).replace(str(Path.home()), '~', 1)}`"
    return f"`{json.dumps(value) if not isinstance(value, float) else f'{value:g}'}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


if __name__ == "__main__":
    PAGE.write_text(render(), encoding="utf-8")
    print(f"wrote {PAGE}")
