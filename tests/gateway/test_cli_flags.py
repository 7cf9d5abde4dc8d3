"""``iotgw serve``'s options are generated from the settings model: every setting has exactly one
flag, each flag sets its own setting, the established names still work, help shows defaults and
reads as what each flag does; ``--version`` prints the installed version."""

from __future__ import annotations

import argparse
from importlib.metadata import version
from pathlib import Path

import pytest

from gateway.cli import build_parser, main
from gateway.settings.cli import FLAG_NAMES, OFF_HELP, SECTIONS, flag_of, settings_overrides
from gateway.settings.schema import GatewaySettings


def _serve_parser() -> argparse.ArgumentParser:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    serve = action.choices["serve"]
    assert isinstance(serve, argparse.ArgumentParser)
    return serve


def _load(*argv: str) -> GatewaySettings:
    args = build_parser().parse_args(["serve", *argv])
    return GatewaySettings.load(None, **settings_overrides(args))


def test_every_setting_has_one_flag_and_no_flag_is_shared() -> None:
    flags = [
        flag_of(section, name)
        for section in SECTIONS
        for name in type(getattr(GatewaySettings(), section)).model_fields
    ]
    assert len(flags) == len(set(flags)), sorted(f for f in flags if flags.count(f) > 1)
    options = {o for a in _serve_parser()._actions for o in a.option_strings}
    assert set(flags) <= options
    # Every established name refers to a setting that exists.
    for section, name in FLAG_NAMES:
        assert name in type(getattr(GatewaySettings(), section)).model_fields, (section, name)


@pytest.mark.parametrize(
    ("argv", "section", "name", "expected"),
    [
        (["--http-port", "9099"], "http", "port", 9099),
        (["--host", "127.0.0.2"], "http", "host", "127.0.0.2"),
        (["--read-timeout", "4.5"], "http", "read_timeout_s", 4.5),
        (["--model-repo", "/tmp/r"], "serving", "model_repo", Path("/tmp/r")),
        (["--max-dims", "5"], "serving", "max_dims", 5),
        (["--shutdown-grace", "7"], "serving", "shutdown_grace_s", 7.0),
        (["--grpc-port", "9001"], "grpc", "port", 9001),
        (["--no-grpc"], "grpc", "enabled", False),
        (["--grpc-stream-max-in-flight", "8"], "grpc", "stream_max_in_flight", 8),
        (["--broker", "mqtt://b:1884"], "mqtt", "broker", "mqtt://b:1884"),
        (["--mqtt-port", "1999"], "mqtt", "embedded_port", 1999),
        (["--mqtt-client-id", "gw-7"], "mqtt", "client_id", "gw-7"),
        (["--mqtt-max-backlog", "12"], "mqtt", "max_backlog", 12),
        (["--mqtt-protocol", "3.1.1"], "mqtt", "protocol", "3.1.1"),
        (["--no-mqtt"], "mqtt", "enabled", False),
        (["--mqtt-tls-insecure"], "mqtt", "tls_insecure", True),
        (["--no-tuner"], "tuner", "enabled", False),
        (["--tuner", "bo"], "tuner", "algorithm", "bo"),
        (["--tune-models", "a, b"], "tuner", "models", ["a", "b"]),
        (["--no-tuner-profiles"], "tuner", "profiles", False),
        (["--tuner-seed", "3"], "tuner", "seed", 3),
    ],
)
def test_a_flag_sets_its_setting(
    argv: list[str], section: str, name: str, expected: object
) -> None:
    assert getattr(getattr(_load(*argv), section), name) == expected


def test_options_left_out_keep_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IOTGW_HTTP__PORT", "8181")
    monkeypatch.setenv("IOTGW_MQTT__RECEIVE_MAXIMUM", "9")
    settings = _load("--receive-maximum", "11")
    assert settings.http.port == 8181  # no flag: the environment holds
    assert settings.mqtt.receive_maximum == 11  # the flag wins


def test_a_flag_value_outside_its_bounds_is_a_settings_error() -> None:
    with pytest.raises(ValueError, match="receive_maximum"):
        _load("--receive-maximum", "0")


def test_help_shows_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # one line per option: no wrapped words
    text = _serve_parser().format_help()
    for words in ("(default 8080)", "(default 1883)", "(default 64)", "(default adaptive-rrl)"):
        assert words in text, words


def _help_of(flag: str) -> str:
    """The help text of ``flag`` as ``iotgw serve --help`` prints it (``%%`` unescaped)."""
    action = next(a for a in _serve_parser()._actions if flag in a.option_strings)
    assert action.help is not None
    return action.help.replace("%%", "%")


def test_a_boolean_flag_reads_as_what_it_does() -> None:
    """A boolean is ``--X`` / ``--no-X`` with the help of ``--X``; a ``--no-...`` name alone says
    what turning it off does, never the field's description of it on (the opposite)."""
    booleans = [
        (section, name, field)
        for section in SECTIONS
        for name, field in type(getattr(GatewaySettings(), section)).model_fields.items()
        if field.annotation is bool
    ]
    assert booleans
    for section, name, field in booleans:
        flag = flag_of(section, name)
        action = next(a for a in _serve_parser()._actions if flag in a.option_strings)
        assert action.help is not None
        if flag.startswith("--no-"):
            assert action.option_strings == [flag]
            assert action.help == OFF_HELP[(section, name)], flag
            assert (field.description or "").rstrip(".") not in action.help, flag
        else:
            assert action.option_strings == [flag, f"--no-{flag[2:]}"], flag
            assert action.help.startswith((field.description or "").rstrip(".")), flag
    assert _help_of("--no-mqtt") == "Serve inference requests over MQTT (default on)"
    assert _help_of("--no-tuner").startswith("Leave the online tuner off")


def test_mqtt_is_on_by_its_flag_and_off_by_the_established_one() -> None:
    assert _load("--mqtt").mqtt.enabled is True
    assert _load("--no-mqtt").mqtt.enabled is False
    assert _load("--no-mqtt", "--mqtt").mqtt.enabled is True  # the last one given wins


def test_help_says_what_the_cache_holds_and_which_shutdown_limit_wins() -> None:
    cache = _help_of("--cache-dir")
    for what in ("demo repository", "Mosquitto", "persistent store", "plans"):
        assert what in cache, what
    # Each of the two shutdown limits names the other and says which applies to what.
    assert "--mqtt-drain-timeout-s" in _help_of("--shutdown-grace")
    assert "shorter" in _help_of("--shutdown-grace")
    assert "--shutdown-grace" in _help_of("--mqtt-drain-timeout-s")
    assert "shorter" in _help_of("--mqtt-drain-timeout-s")


@pytest.mark.parametrize("argv", [["--version"], ["serve", "--version"]])
def test_version_prints_the_installed_version(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"iotgw {version('iotgw')}\n"
