"""The ``iotgw`` command line."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError


def _serve_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "serve",
        help="run the gateway",
        description="Serve a model repository over HTTP (Open Inference Protocol v2 and "
        "TF Serving REST). Every option can also be set as an IOTGW_* environment variable "
        "(nested with __, e.g. IOTGW_HTTP__PORT) or in a TOML file given with --config.",
    )
    p.add_argument("--config", type=Path, help="TOML settings file ([http], [serving] tables)")
    p.add_argument("--host", help="HTTP listen address (default 127.0.0.1)")
    p.add_argument("--http-port", type=int, help="HTTP port (default 8080; 0 picks a free one)")
    p.add_argument(
        "--model-repo",
        type=Path,
        help="model repository <repo>/<model>/<version>/config.toml "
        "(default: the bundled demo repository)",
    )
    p.add_argument(
        "--cache-dir",
        type=Path,
        help="where the bundled demo repository is built (default ~/.cache/iotgw)",
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        help="largest request body in bytes (default 16 MiB); larger ones get 413",
    )
    p.add_argument(
        "--executor-threads",
        type=int,
        help="threads running backend calls and model loads (default 32)",
    )
    p.add_argument(
        "--max-concurrency", type=int, help="upper bound of a model's concurrency knob (default 16)"
    )
    _security_arguments(p)
    p.add_argument(
        "--shutdown-grace",
        type=float,
        help="seconds requests already taken may take to finish on SIGTERM (default 25)",
    )
    m = p.add_argument_group("MQTT")
    m.add_argument(
        "--broker",
        help="external broker mqtt://host:port or mqtts://host:port "
        "(default: start the embedded broker on 127.0.0.1)",
    )
    m.add_argument(
        "--mqtt-port",
        type=int,
        help="port of the embedded broker (default 1883; 0 picks a free one)",
    )
    m.add_argument(
        "--mqtt-protocol", choices=["5", "3.1.1"], help="MQTT version towards --broker (default 5)"
    )
    m.add_argument("--no-mqtt", action="store_true", help="serve HTTP only")
    m.add_argument(
        "--mqtt-client-id",
        help="client id, stable across restarts "
        "(default iotgw-<hostname>); give each replica its own",
    )
    m.add_argument("--mqtt-username", help="broker user name")
    m.add_argument(
        "--mqtt-password",
        help="broker password (shown in ps to every user: prefer --mqtt-password-file or "
        "IOTGW_MQTT__PASSWORD_FILE)",
    )
    m.add_argument(
        "--mqtt-password-file", type=Path, help="file holding the broker password (not shown in ps)"
    )
    m.add_argument("--mqtt-ca-file", type=Path, help="CA bundle for mqtts://")
    m.add_argument("--mqtt-cert-file", type=Path, help="client certificate for mqtts://")
    m.add_argument("--mqtt-key-file", type=Path, help="client key for mqtts://")
    m.add_argument("--mqtt-qos", type=int, choices=[0, 1], help="QoS (default 1)")
    m.add_argument("--topic-prefix", help="topic prefix (default iotgw)")
    m.add_argument("--share-group", help="shared subscription group (default iotgw)")
    m.add_argument(
        "--shared-subscription",
        choices=["auto", "on", "off"],
        help="use $share/<group>/... (default auto: with MQTT 5)",
    )
    m.add_argument(
        "--receive-maximum", type=int, help="most unacknowledged requests in flight (default 64)"
    )
    m.add_argument(
        "--response-topic-pattern",
        help="topic filter a Response Topic must match, {prefix}/{model}/{device} filled in "
        "(default {prefix}/infer/+/res/{device}/#); others get a 403 reply",
    )
    m.add_argument(
        "--device-identity",
        choices=["topic", "user_property"],
        help="topic: the topic names the device (bind it with the broker's ACL); user_property: "
        "also require the broker-stamped --identity-property to match (default topic)",
    )
    m.add_argument(
        "--identity-property", help="user property holding the publisher id (iotgw-sender)"
    )
    m.add_argument(
        "--embedded-broker",
        choices=["auto", "mosquitto", "amqtt"],
        help="embedded broker without --broker (default auto: mosquitto when installed)",
    )
    m.add_argument(
        "--embedded-password-file",
        type=Path,
        help="mosquitto_passwd file for the embedded broker (the gateway logs in with "
        "--mqtt-username/--mqtt-password)",
    )
    t = p.add_argument_group("online tuner")
    t.add_argument("--no-tuner", action="store_true", help="keep the configured knobs")
    t.add_argument(
        "--tuner",
        choices=["rrl", "adaptive-rrl", "bo", "hill-climb", "aimd", "inflight"],
        help="tuning algorithm (default adaptive-rrl)",
    )
    t.add_argument(
        "--tuner-objective", choices=["latency", "cost"], help="what it minimizes (latency)"
    )
    t.add_argument("--tune-models", help="comma-separated models to tune (default: all)")
    p.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"])


def _security_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "HTTP security and bounds",
        "A secret given as a flag is visible to every user of this machine (ps, "
        "/proc/<pid>/cmdline); give it in a file (--*-token-file, or IOTGW_HTTP__*_TOKEN_FILE) "
        "or in the environment (IOTGW_HTTP__*_TOKEN), which ps does not show.",
    )
    for name, guards in (
        ("admin", "/admin"),
        ("inference", "/v2/models/..., /v2/repository/... and /v1/..."),
        ("metrics", "/metrics"),
    ):
        g.add_argument(
            f"--{name}-token",
            metavar="TOKEN",
            help=f"require 'Authorization: Bearer TOKEN' on {guards} (shown in ps: prefer "
            f"--{name}-token-file)",
        )
        g.add_argument(
            f"--{name}-token-file",
            type=Path,
            metavar="FILE",
            help=f"file holding the {name} token (trailing newline stripped)",
        )
    g.add_argument(
        "--allow-unauthenticated-admin",
        action="store_true",
        default=None,
        help="start on a non-loopback --host without an admin token (anyone reaching the port "
        "can change knobs and the tuner)",
    )
    g.add_argument("--tls-cert-file", type=Path, help="PEM certificate chain: serve HTTPS")
    g.add_argument("--tls-key-file", type=Path, help="PEM private key of --tls-cert-file")
    g.add_argument(
        "--max-connections",
        type=int,
        help="HTTP connections served at once (default 1024); beyond: 503 and closed",
    )
    g.add_argument(
        "--read-timeout",
        type=float,
        help="seconds a request body may take to arrive (default 30); slower: 408 and closed",
    )
    g.add_argument(
        "--keepalive-timeout",
        type=float,
        help="seconds before an idle HTTP connection is closed (default 60)",
    )


def _security_overrides(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "admin_token": args.admin_token,
        "admin_token_file": args.admin_token_file,
        "inference_token": args.inference_token,
        "inference_token_file": args.inference_token_file,
        "metrics_token": args.metrics_token,
        "metrics_token_file": args.metrics_token_file,
        "allow_unauthenticated_admin": args.allow_unauthenticated_admin,
        "tls_cert_file": args.tls_cert_file,
        "tls_key_file": args.tls_key_file,
        "max_connections": args.max_connections,
        "read_timeout_s": args.read_timeout,
        "keepalive_timeout_s": args.keepalive_timeout,
    }


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    http = {
        k: v
        for k, v in {
            "host": args.host,
            "port": args.http_port,
            "max_body_bytes": args.max_body_bytes,
            **_security_overrides(args),
        }.items()
        if v is not None
    }
    serving = {
        k: v
        for k, v in {
            "model_repo": args.model_repo,
            "cache_dir": args.cache_dir,
            "executor_threads": args.executor_threads,
            "max_concurrency": args.max_concurrency,
            "shutdown_grace_s": args.shutdown_grace,
        }.items()
        if v is not None
    }
    mqtt = {
        k: v
        for k, v in {
            "broker": args.broker,
            "embedded_port": args.mqtt_port,
            "protocol": args.mqtt_protocol,
            "client_id": args.mqtt_client_id,
            "username": args.mqtt_username,
            "password": args.mqtt_password,
            "password_file": args.mqtt_password_file,
            "ca_file": args.mqtt_ca_file,
            "cert_file": args.mqtt_cert_file,
            "key_file": args.mqtt_key_file,
            "qos": args.mqtt_qos,
            "topic_prefix": args.topic_prefix,
            "share_group": args.share_group,
            "shared_subscription": args.shared_subscription,
            "receive_maximum": args.receive_maximum,
            "response_topic_pattern": args.response_topic_pattern,
            "device_identity": args.device_identity,
            "identity_property": args.identity_property,
            "embedded_broker": args.embedded_broker,
            "embedded_password_file": args.embedded_password_file,
        }.items()
        if v is not None
    }
    if args.no_mqtt:
        mqtt["enabled"] = False
    tuner = {
        k: v
        for k, v in {
            "algorithm": args.tuner,
            "objective": args.tuner_objective,
            "models": args.tune_models.split(",") if args.tune_models else None,
        }.items()
        if v is not None
    }
    if args.no_tuner:
        tuner["enabled"] = False
    out: dict[str, Any] = {"mqtt": mqtt} if mqtt else {}
    if tuner:
        out["tuner"] = tuner
    if http:
        out["http"] = http
    if serving:
        out["serving"] = serving
    if args.log_level:
        out["log_level"] = args.log_level
    return out


def _run_serve(args: argparse.Namespace) -> int:
    from gateway.main import serve
    from gateway.settings import GatewaySettings

    try:
        settings = GatewaySettings.load(args.config, **_overrides(args))
    except (ValidationError, FileNotFoundError) as exc:
        print(f"iotgw serve: invalid settings: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return asyncio.run(serve(settings))


def _bench_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("bench", help="run a benchmark (writes benchmarks/results/<name>.json)")
    p.add_argument(
        "name", choices=["chaos", "fuzz", "http", "mqtt", "quant", "tuner"], help="which benchmark"
    )
    p.add_argument("--quick", action="store_true", help="a few seconds, to check it still works")
    p.add_argument("--out", type=Path, help="results directory (default benchmarks/results)")
    p.add_argument("--soak", action="store_true", help="chaos: add the 30-minute soak run")


def _run_bench(args: argparse.Namespace) -> int:
    import importlib

    module = importlib.import_module(f"benchmarks.{args.name}")
    extra = {"soak": True} if args.soak else {}  # only the chaos bench takes it
    return int(module.main(quick=args.quick, out_dir=args.out, **extra) or 0)


def _checkpoint_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Listed for --help only: ``main`` hands these commands to ``models.cli`` first."""
    sub.add_parser("quantize", help="import weights into a block-quantized checkpoint")
    sub.add_parser("inspect", help="summarize and verify a checkpoint")
    sub.add_parser("train", help="ZeRO++-style training of the digits CNN (iotgw train --help)")


def _tuning_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Listed for --help only: ``main`` hands these commands to ``rrl.cli`` first."""
    sub.add_parser("profile", help="measure the runtime for the tuner's offline testbed")
    sub.add_parser("tune", help="evaluate the tuners on the offline testbed (--evaluate)")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["sim"]:
        # The simulator has its own sub-commands and options (`iotgw sim --help`); it talks to
        # the gateway over the wire only, so it is not wired through the gateway's settings.
        from device_sim.cli import main as sim_main

        return sim_main(argv[1:])
    if argv[:1] in (["quantize"], ["inspect"]):
        # Offline checkpoint tools with their own options (`iotgw quantize --help`): they
        # start nothing and read none of the gateway's settings.
        from models.cli import main as checkpoint_main

        return checkpoint_main(argv)
    if argv[:1] == ["train"]:
        # The ZeRO++/SimiGrad trainer (`iotgw train --help`): offline, TensorFlow only.
        from models.train.cli import main as train_main

        return train_main(argv[1:])
    if argv[:1] in (["profile"], ["tune"]):
        # The tuner's offline commands (`iotgw tune --help`): runtime sessions and a replayed
        # testbed, no gateway settings.
        from rrl.cli import main as tuning_main

        return tuning_main(argv)
    parser = argparse.ArgumentParser(prog="iotgw", description="Edge/IoT inference gateway")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    sub.add_parser("sim", help="device simulator: replay device traffic (iotgw sim --help)")
    _bench_parser(sub)
    _checkpoint_parsers(sub)
    _tuning_parsers(sub)
    args = parser.parse_args(argv)
    if args.command == "serve":
        return _run_serve(args)
    return _run_bench(args)


if __name__ == "__main__":
    raise SystemExit(main())
