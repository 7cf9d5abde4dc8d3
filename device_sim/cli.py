"""``iotgw sim``: run virtual devices against a gateway, or record a broker's requests.

``main(argv)`` takes the arguments after ``sim`` (e.g. ``["run", "--rate", "50", ...]``) and
returns the exit status: 0 done, 2 invalid arguments or inputs, 1 the run could not connect.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import aiomqtt

from device_sim.arrivals import make_process
from device_sim.endpoints import BrokerAddress, require_loopback
from device_sim.recorder import RecordOptions, payload_dir, record
from device_sim.report import headline
from device_sim.runner import SimOptions, simulate
from device_sim.scenario import Scenario, load_scenario, single_phase
from device_sim.summary import summarize
from device_sim.tensors import DataFile

# A broker or gateway that is not there (connection refused, TLS failure, HTTP error).
_CONNECT_ERRORS = (ConnectionError, aiohttp.ClientError, aiomqtt.MqttError)
_PROCESS_ARGS = {
    "constant": ("rate",),
    "poisson": ("rate",),
    "onoff": ("rate", "on_s", "off_s", "off_rate"),
    "diurnal": ("rate", "amplitude", "period_s"),
}


def _run_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "run",
        help="send requests from virtual devices and measure them",
        description="Virtual devices send inference requests over MQTT 5, MQTT 3.1.1 or HTTP on "
        "an arrival process, a scenario file or a recorded trace, and measure every reply. "
        "Writes summary.json and latency/rate/errors PNGs to --out.",
    )
    _load_arguments(p)
    _where_arguments(p)
    _device_arguments(p)
    _measurement_arguments(p)


def _load_arguments(p: argparse.ArgumentParser) -> None:
    load = p.add_argument_group("load (one of --arrival, --scenario, --trace)")
    source = load.add_mutually_exclusive_group(required=True)
    source.add_argument("--arrival", choices=sorted(_PROCESS_ARGS), help="arrival process")
    source.add_argument("--scenario", type=Path, help="phases file (.toml or .json)")
    source.add_argument("--trace", type=Path, help="trace to replay (.csv or .jsonl)")
    load.add_argument("--rate", type=float, help="requests/s over all devices (on-rate, mean)")
    load.add_argument("--duration", type=float, help="seconds of load (--arrival)")
    load.add_argument("--on-s", type=float, default=1.0, help="onoff: burst length (s)")
    load.add_argument("--off-s", type=float, default=4.0, help="onoff: pause length (s)")
    load.add_argument("--off-rate", type=float, default=0.0, help="onoff: rate in pauses")
    load.add_argument("--amplitude", type=float, default=0.5, help="diurnal: 0..1 of the mean")
    load.add_argument("--period-s", type=float, default=60.0, help="diurnal: period (s)")
    load.add_argument("--speed", type=float, default=1.0, help="trace replay speed factor")


def _where_arguments(p: argparse.ArgumentParser) -> None:
    where = p.add_argument_group("where")
    where.add_argument(
        "--transport",
        choices=["mqtt", "mqtt5", "mqtt311", "http"],
        default="mqtt",
        help="mqtt: MQTT 5 when the broker accepts it, else MQTT 3.1.1 (one log line says so); "
        "mqtt5 or mqtt311: that version only; http: the gateway's HTTP API (default mqtt)",
    )
    where.add_argument("--broker", default="mqtt://127.0.0.1:1883", help="mqtt[s]:// URL")
    where.add_argument(
        "--http-url",
        help="gateway base URL: the HTTP devices' target, and where metadata is fetched",
    )
    where.add_argument("--prefix", default="iotgw", help="MQTT topic prefix")
    where.add_argument("--qos", type=int, choices=[0, 1, 2], default=1)
    where.add_argument(
        "--allow-remote", action="store_true", help="allow non-loopback broker/gateway hosts"
    )


def _device_arguments(p: argparse.ArgumentParser) -> None:
    who = p.add_argument_group("devices and payloads")
    who.add_argument("--devices", type=int, default=10, help="virtual devices (default 10)")
    who.add_argument("--device-prefix", default="dev", help="device ids are <prefix><n>")
    who.add_argument(
        "--connections",
        type=int,
        help="MQTT connections shared by the devices (default: one per device)",
    )
    who.add_argument("--model", action="append", default=[], help="target model (repeatable)")
    who.add_argument(
        "--metadata",
        type=Path,
        action="append",
        default=[],
        help="JSON model metadata (GET /v2/models/{m} answer, or a list of them)",
    )
    who.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="MODEL:INPUT=FILE.npy",
        help="send rows of a .npy file as that input (repeatable)",
    )
    who.add_argument("--framing", choices=["json", "binary"], default="json")
    who.add_argument("--batch", type=int, default=1, help="rows per request")
    who.add_argument("--deadline-ms", type=float, help="request 'timeout' parameter")


def _measurement_arguments(p: argparse.ArgumentParser) -> None:
    measure = p.add_argument_group("measurement and bounds")
    measure.add_argument("--seed", type=int, default=0)
    measure.add_argument("--timeout-s", type=float, default=5.0, help="reply wait before lost")
    measure.add_argument("--slo-ms", type=float, help="latency objective to count violations")
    measure.add_argument("--max-requests", type=int, default=1_000_000)
    measure.add_argument("--max-duration-s", type=float, default=3600.0)
    measure.add_argument("--max-in-flight", type=int, default=10_000)
    measure.add_argument("--out", type=Path, default=Path("sim-results"), help="output folder")
    measure.add_argument("--no-plots", action="store_true", help="write summary.json only")
    measure.add_argument("--quiet", action="store_true", help="no per-second progress lines")


def _record_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "record",
        help="capture the requests crossing a broker into a trace",
        description="Subscribes to <prefix>/infer/+/req/+ and writes each request into a trace "
        "(.csv or .jsonl), its payload into <trace stem>.payloads/. Stops after --duration-s "
        "or --count requests.",
    )
    p.add_argument("--out", type=Path, required=True, help="trace file (.csv or .jsonl)")
    p.add_argument("--broker", default="mqtt://127.0.0.1:1883", help="mqtt[s]:// URL")
    p.add_argument("--prefix", default="iotgw", help="MQTT topic prefix")
    p.add_argument("--duration-s", type=float, default=60.0, help="stop after (default 60)")
    p.add_argument("--count", type=int, default=100_000, help="stop after this many requests")
    p.add_argument(
        "--protocol",
        choices=["auto", "5", "3.1.1"],
        default="auto",
        help="MQTT version; auto: 5 when the broker accepts it, else 3.1.1 (default auto)",
    )
    p.add_argument("--qos", type=int, choices=[0, 1, 2], default=1)
    p.add_argument("--allow-remote", action="store_true", help="allow a non-loopback broker")
    p.add_argument(
        "--quiet", action="store_true", help="no start line and no progress line every 5 s"
    )


def _positive(name: str, value: float | None) -> None:
    if value is not None and not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}")


def _scenario(args: argparse.Namespace) -> Scenario | None:
    if args.scenario is not None:
        return load_scenario(args.scenario)
    if args.arrival is None:
        return None
    if args.rate is None or args.duration is None:
        raise ValueError(f"--arrival {args.arrival} needs --rate and --duration")
    params = {k: getattr(args, k) for k in _PROCESS_ARGS[args.arrival]}
    return single_phase(make_process(args.arrival, params), args.duration, args.arrival)


def sim_options(args: argparse.Namespace) -> SimOptions:
    """The run's options from parsed ``run`` arguments (raises ValueError when inconsistent)."""
    for name in ("devices", "batch", "max_requests", "max_in_flight", "timeout_s", "speed"):
        _positive(f"--{name.replace('_', '-')}", getattr(args, name))
    _positive("--max-duration-s", args.max_duration_s)
    _positive("--connections", args.connections)
    if args.trace is None and not args.model and args.scenario is None:
        raise ValueError("name the target model(s) with --model")
    return SimOptions(
        transport=args.transport,
        broker=args.broker,
        http_url=args.http_url,
        prefix=args.prefix,
        qos=args.qos,
        devices=args.devices,
        device_prefix=args.device_prefix,
        connections=args.connections,
        models=tuple(args.model),
        metadata_files=tuple(args.metadata),
        data_files=tuple(DataFile.parse(d) for d in args.data),
        binary=args.framing == "binary",
        batch=args.batch,
        deadline_ms=args.deadline_ms,
        scenario=_scenario(args),
        trace=args.trace,
        speed=args.speed,
        seed=args.seed,
        timeout_s=args.timeout_s,
        slo_ms=args.slo_ms,
        max_requests=args.max_requests,
        max_duration_s=args.max_duration_s,
        max_in_flight=args.max_in_flight,
        allow_remote=args.allow_remote,
    )


def _run(args: argparse.Namespace) -> int:
    options = sim_options(args)
    try:
        result = asyncio.run(simulate(options, progress=None if args.quiet else sys.stderr))
    except _CONNECT_ERRORS as exc:
        print(f"iotgw sim run: cannot connect: {exc}", file=sys.stderr)
        return 1
    run_info = {**result.run_info, "created": datetime.now(UTC).isoformat(timespec="seconds")}
    summary = summarize(
        result.plan, result.ledger, slo_ms=options.slo_ms, elapsed_s=result.elapsed_s, run=run_info
    )
    args.out.mkdir(parents=True, exist_ok=True)
    summary_path = args.out / "summary.json"
    summary_path.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(headline(summary))
    print(f"summary: {summary_path}")
    if not args.no_plots:
        from device_sim.plots import write_plots  # matplotlib costs ~0.5 s to import: only here

        for path in write_plots(summary, args.out):
            print(f"plot: {path}")
    return 0


def _record(args: argparse.Namespace) -> int:
    broker = BrokerAddress.parse(args.broker)
    _positive("--duration-s", args.duration_s)
    _positive("--count", args.count)
    options = RecordOptions(
        broker=broker,
        trace=args.out,
        prefix=args.prefix,
        duration_s=args.duration_s,
        max_count=args.count,
        version=args.protocol,
        qos=args.qos,
    )

    async def checked_record() -> int:
        if not args.allow_remote:
            await require_loopback(broker.host)
        return await record(options, progress=None if args.quiet else sys.stderr)

    try:
        count = asyncio.run(checked_record())
    except _CONNECT_ERRORS as exc:
        print(f"iotgw sim record: cannot connect: {exc}", file=sys.stderr)
        return 1
    print(f"recorded {count} requests into {args.out} (payloads in {payload_dir(args.out)})")
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="iotgw sim", description="Virtual IoT devices: load generation and trace capture"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _run_parser(sub)
    _record_parser(sub)
    # Notices such as an MQTT version fallback: one plain line on stderr (a no-op when the
    # caller has configured logging already).
    logging.basicConfig(level=logging.WARNING, format="iotgw sim: %(message)s")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed by argparse
        return int(exc.code or 0)
    try:
        return _run(args) if args.command == "run" else _record(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"iotgw sim {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
