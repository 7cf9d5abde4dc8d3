"""The ``iotgw`` command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pydantic import ValidationError


def installed_version() -> str:
    """The installed distribution's version: what ``pip install`` put in the package metadata."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("iotgw")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed: pip install -e . in the checkout)"


def _add_version(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--version",
        action="version",
        version=f"iotgw {installed_version()}",
        help="print the installed version and exit",
    )


def _serve_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from gateway.settings.cli import add_settings_arguments

    p = sub.add_parser(
        "serve",
        help="run the gateway",
        description="Serve a model repository over HTTP (Open Inference Protocol v2 and "
        "TF Serving REST) and MQTT. Every option is also an IOTGW_* environment variable "
        "(IOTGW_<SECTION>__<SETTING>, e.g. IOTGW_HTTP__PORT) or a key of a TOML file given with "
        "--config ([http], [serving], [mqtt] and [tuner] tables); options win over the "
        "environment, which wins over the file.",
    )
    _add_version(p)
    p.add_argument("--config", type=Path, help="TOML settings file")
    add_settings_arguments(p)


def _run_serve(args: argparse.Namespace) -> int:
    from gateway import event_loop
    from gateway.codecs import json_codec
    from gateway.logs import configure_logging
    from gateway.main import serve
    from gateway.settings.cli import settings_overrides
    from gateway.settings.schema import GatewaySettings

    try:
        settings = GatewaySettings.load(args.config, **settings_overrides(args))
    except (ValidationError, FileNotFoundError) as exc:
        print(f"iotgw serve: invalid settings: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_format)
    json_codec.select(settings.serving.json_codec)
    try:
        return event_loop.run(serve(settings), settings.serving.event_loop)
    except event_loop.EventLoopUnavailable as exc:
        print(f"iotgw serve: {exc}", file=sys.stderr)
        return 2


def _bench_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("bench", help="run a benchmark (writes benchmarks/results/<name>.json)")
    p.add_argument(
        "name",
        choices=[
            "chaos",
            "find",
            "fuzz",
            "gpu",
            "grpc",
            "http",
            "ingest",
            "mqtt",
            "peers",
            "quant",
            "tuner",
        ],
        help="which benchmark",
    )
    p.add_argument("--quick", action="store_true", help="a few seconds, to check it still works")
    p.add_argument(
        "--out",
        type=Path,
        help="results directory (default: the checkout's benchmarks/results; installed: "
        "$IOTGW_RESULTS_DIR or ./iotgw-results)",
    )
    p.add_argument("--soak", action="store_true", help="chaos: add the 30-minute soak run")
    p.add_argument("--cases", help="chaos: the cases to run, letters of a-d and f (default all)")
    p.add_argument("--overload-model", help="chaos: the demo model case d overloads")


def _run_bench(args: argparse.Namespace) -> int:
    import importlib

    module = importlib.import_module(f"benchmarks.{args.name}")
    chaos_only = {"soak": args.soak or None, "cases": args.cases}
    chaos_only["overload_model"] = args.overload_model
    extra = {k: v for k, v in chaos_only.items() if v is not None}
    if extra and args.name != "chaos":
        print(f"iotgw bench {args.name}: --soak, --cases and --overload-model are chaos options")
        return 2
    if "cases" in extra:
        try:
            extra["cases"] = module.parse_cases(extra["cases"])
        except ValueError as exc:
            print(f"iotgw bench chaos: {exc}")
            return 2
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="iotgw", description="Edge/IoT inference gateway")
    _add_version(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    sub.add_parser("sim", help="device simulator: replay device traffic (iotgw sim --help)")
    _bench_parser(sub)
    _checkpoint_parsers(sub)
    _tuning_parsers(sub)
    sub.add_parser("doctor", help="providers, devices and where each model runs (--json)")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["doctor"]:
        from gateway.doctor import main as doctor_main  # its own options: iotgw doctor --help

        return doctor_main(argv[1:])
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
    if argv[:2] == ["bench", "find"]:
        # Its own selection of models, loads and starts (`iotgw bench find --help`): a whole
        # run takes hours, so one load is measured on its own.
        from benchmarks.find.run import cli as find_cli

        return find_cli(argv[2:])
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return _run_serve(args)
    return _run_bench(args)


if __name__ == "__main__":
    raise SystemExit(main())
