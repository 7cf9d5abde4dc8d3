"""The ``iotgw serve`` options, generated from the settings model, so a setting is declared once:
its type, default, bounds and help live on its pydantic field, and the flag follows.

A flag is ``--<field>`` for the HTTP and serving sections, ``--grpc-<field>``, ``--mqtt-<field>``
and ``--tuner-<field>`` for the others (underscores as dashes), except the established names in
``FLAG_NAMES``. A boolean is ``--X`` / ``--no-X``, its help saying what ``--X`` does; an
established ``--no-...`` name with no positive form gets the help of ``OFF_HELP``, what turning
it off does. Options left out keep the value from the environment, the TOML file or the default.
"""

from __future__ import annotations

import argparse
import types
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from gateway.settings.schema import GatewaySettings

# section -> (flag prefix, group title, group description)
SECTIONS: dict[str, tuple[str, str, str | None]] = {
    "http": (
        "",
        "HTTP",
        "A secret given as a flag is visible to every user of this machine (ps, "
        "/proc/<pid>/cmdline); give it in a file (--*-file, or IOTGW_HTTP__*_FILE) or in the "
        "environment (IOTGW_HTTP__*), which ps does not show.",
    ),
    "grpc": ("grpc-", "gRPC", "Listens on --host with the HTTP TLS files and tokens."),
    "serving": ("", "serving", None),
    "mqtt": ("mqtt-", "MQTT", None),
    "tuner": ("tuner-", "online tuner", None),
}
_SEP = "__"  # argparse dest: <section>__<field>

# Flags whose names predate the rule (documented, used by scripts): names only, nothing else.
FLAG_NAMES: dict[tuple[str, str], str] = {
    ("http", "port"): "--http-port",
    ("http", "read_timeout_s"): "--read-timeout",
    ("http", "keepalive_timeout_s"): "--keepalive-timeout",
    ("http", "refusal_pace_s"): "--refusal-pace",
    ("grpc", "enabled"): "--grpc",  # and --no-grpc
    ("serving", "shutdown_grace_s"): "--shutdown-grace",
    ("mqtt", "enabled"): "--mqtt",  # and --no-mqtt, the form scripts use
    ("mqtt", "broker"): "--broker",
    ("mqtt", "embedded_port"): "--mqtt-port",
    ("mqtt", "embedded_broker"): "--embedded-broker",
    ("mqtt", "embedded_password_file"): "--embedded-password-file",
    ("mqtt", "topic_prefix"): "--topic-prefix",
    ("mqtt", "shared_subscription"): "--shared-subscription",
    ("mqtt", "share_group"): "--share-group",
    ("mqtt", "receive_maximum"): "--receive-maximum",
    ("mqtt", "response_topic_pattern"): "--response-topic-pattern",
    ("mqtt", "device_identity"): "--device-identity",
    ("mqtt", "identity_property"): "--identity-property",
    ("tuner", "enabled"): "--no-tuner",
    ("tuner", "algorithm"): "--tuner",
    ("tuner", "models"): "--tune-models",
}

# ``--no-tuner`` alone: ``--tuner`` names the algorithm, so the setting has no ``--X`` form and
# the field's description (what it does on) would read as the opposite of what the flag does.
OFF_HELP: dict[tuple[str, str], str] = {
    ("tuner", "enabled"): "Leave the online tuner off: each model keeps the knobs its config.toml "
    "sets (default: the tuner runs and retunes each model's knobs under load)",
}


def add_settings_arguments(parser: argparse.ArgumentParser) -> None:
    for section, (_prefix, title, description) in SECTIONS.items():
        group = parser.add_argument_group(title, _escape(description) if description else None)
        for name, field in _section_model(section).model_fields.items():
            _add(group, section, name, field)
    for name in ("log_level", "log_format"):  # the top-level settings
        field = GatewaySettings.model_fields[name]
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            dest=f"{name}{_SEP}",
            choices=list(get_args(field.annotation)),
            default=None,
            help=_help(field),
        )


def settings_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The nested overrides for ``GatewaySettings.load``: only the options given."""
    out: dict[str, Any] = {}
    for dest, value in vars(args).items():
        if _SEP not in dest or value is None:
            continue
        section, name = dest.split(_SEP, 1)
        if not name:
            out[section] = value
        else:
            out.setdefault(section, {})[name] = value
    return out


def flag_of(section: str, name: str) -> str:
    return FLAG_NAMES.get((section, name)) or f"--{SECTIONS[section][0]}{name.replace('_', '-')}"


def flag_forms(section: str, name: str) -> list[str]:
    """Every option string of a setting: a boolean's ``--X`` comes with its ``--no-X``."""
    flag = flag_of(section, name)
    field = _section_model(section).model_fields[name]
    if _kind(field.annotation)[0] is bool and not flag.startswith("--no-"):
        return [flag, f"--no-{flag.removeprefix('--')}"]
    return [flag]


def _section_model(section: str) -> type[BaseModel]:
    model = GatewaySettings.model_fields[section].annotation
    assert isinstance(model, type) and issubclass(model, BaseModel)
    return model


def _add(group: Any, section: str, name: str, field: FieldInfo) -> None:
    dest, flag = f"{section}{_SEP}{name}", flag_of(section, name)
    kind, choices = _kind(field.annotation)
    help_text = _help(field)
    if kind is bool:
        if flag.startswith("--no-"):
            off = _escape(OFF_HELP[(section, name)])  # a KeyError here: add its help there
            group.add_argument(
                flag, dest=dest, action="store_const", const=False, default=None, help=off
            )
        else:
            group.add_argument(
                flag, dest=dest, action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
        return
    metavar = None if choices else _METAVARS.get(kind, "VALUE")
    if field.annotation is not None and SecretStr in get_args(field.annotation):
        metavar = "SECRET"
    group.add_argument(
        flag,
        dest=dest,
        type=_comma_list if kind is list else kind,
        choices=choices,
        default=None,
        metavar=metavar,
        help=help_text,
    )


_METAVARS: dict[Any, str] = {int: "N", float: "NUM", str: "TEXT", Path: "PATH", list: "A,B,..."}


def _kind(annotation: Any) -> tuple[Any, list[Any] | None]:
    """The argparse type (and choices) of a field's annotation, optional unwrapped."""
    if get_origin(annotation) in (Union, types.UnionType):
        (annotation,) = [a for a in get_args(annotation) if a is not type(None)]
    if get_origin(annotation) is Literal:
        values = list(get_args(annotation))
        return type(values[0]), values
    if get_origin(annotation) is list:
        return list, None
    if annotation is SecretStr:
        return str, None
    if annotation in (bool, int, float, str, Path):
        return annotation, None
    raise TypeError(f"no command-line form for a setting of type {annotation!r}")


def _comma_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _help(field: FieldInfo) -> str:
    text = (field.description or "").rstrip(".")
    default = _default(field)
    if default is not None:
        text += f" (default {default})"
    if field.annotation is not None and SecretStr in get_args(field.annotation):
        text += "; as a flag it shows in ps: prefer the *-file option or the environment"
    return _escape(text)


def _default(field: FieldInfo) -> str | None:
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return None
    else:
        value = field.default
    if value is None or value == [] or isinstance(value, bool):
        return None if not isinstance(value, bool) else ("on" if value else "off")
    return str(value)


def _escape(text: str) -> str:
    return text.replace("%", "%%")  # argparse %-formats help strings
