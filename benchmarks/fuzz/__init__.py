"""``iotgw bench fuzz``: a structure-aware fuzzer against a live gateway on HTTP, MQTT and gRPC.

Hypothesis draws the cases (``strategies``): Open Inference Protocol JSON, valid and mutated
(wrong types at every field, lying shapes, huge and negative dims, many inputs, deep nesting,
NaN/Infinity tokens, non-UTF-8, duplicated keys, bad parameters), TF Serving JSON, the binary
tensor extension with lying lengths (the HTTP header, ``binary_data_size``, BYTES elements, the
MQTT ``OIPB`` frame's u32), raw bytes; on MQTT also the topic and the MQTT 5 properties; on gRPC
ModelInfer and TF Serving's Predict messages with wrong values, and bytes that are no message
(lying length prefixes, wrong wire types, huge repeated fields, unknown fields, truncations;
``grpc_strategies``). A real Mosquitto and a real ``iotgw serve`` (``sensor_mlp`` only) take them
on the three transports at once, with a well-formed request from another device every tenth send
(``runner``).

Counted per transport (``report``): payloads, crashes (the process exited, or an HTTP
connection reset without a response), stuck (no reply within the timeout where one is owed),
non-4xx answers to bad input (anything but a valid 200 or a 4xx error reply, over gRPC a
client-error status code; 503s and UNAVAILABLE with a reason are counted apart), good requests
answered; then readiness and a last batch of good requests. Results in
``benchmarks/results/fuzz.json`` (``fuzz.quick.json`` with ``--quick``). The same seed draws the
same cases.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
from pathlib import Path

try:
    import hypothesis  # noqa: F401  (only the fuzz bench needs it)
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("iotgw bench fuzz needs hypothesis: pip install 'iotgw[bench]'") from exc

from benchmarks.common import machine_info, source_commit
from benchmarks.fuzz import report
from benchmarks.fuzz.cases import MODEL
from benchmarks.fuzz.runner import Gateway, Plan, fuzz

FULL = Plan(
    payloads_per_transport=50_000,
    chunk=1000,
    window=64,
    good_every=10,
    timeout_s=10.0,
    final_good=50,
    max_restarts=20,
)
QUICK = Plan(
    payloads_per_transport=1500,
    chunk=500,
    window=64,
    good_every=10,
    timeout_s=10.0,
    final_good=20,
    max_restarts=2,
)


def build_repository(dest: Path) -> Path:
    """Only ``sensor_mlp`` (ONNX): the fuzzer aims at the decoding edge, not the models."""
    from models.demo import DEMO_MODELS, VERSION, config_toml, write_model_version
    from models.repository import CONFIG_FILE, read_config

    (demo,) = [m for m in DEMO_MODELS if m.name == MODEL]
    folder = dest / demo.name / str(VERSION)
    write_model_version(demo, folder)
    # The fuzzer judges answers, not latency: with a generous deadline a well-formed request on
    # a busy machine is answered, not refused with a deadline 503.
    config = read_config(folder / CONFIG_FILE).model_copy(update={"slo_ms": 10_000.0})
    (folder / CONFIG_FILE).write_text(config_toml(config), encoding="utf-8")
    return dest


def run(plan: Plan, quick: bool, out_dir: Path | None, logs: Path | None = None) -> Path:
    from benchmarks.servers import start_mosquitto

    machine = machine_info()
    code = source_commit()  # the checkout every gateway of the run starts from
    with tempfile.TemporaryDirectory(prefix="iotgw-bench-fuzz-") as tmp:
        folder = Path(tmp)
        repo = build_repository(folder / "repo")
        broker, port = start_mosquitto(folder)
        with broker:
            gateway = Gateway(folder, repo, port)
            try:
                fuzz_run, figures = asyncio.run(fuzz(plan, gateway, port))
            finally:
                gateway.stop()
        if logs is not None:  # the broker's and every gateway's log, to study a defect
            logs.mkdir(parents=True, exist_ok=True)
            for log in folder.glob("*.log"):
                shutil.copy(log, logs / log.name)
    report.print_table(fuzz_run.tallies)
    path = report.write(
        quick=quick,
        out_dir=out_dir,
        machine=machine,
        tallies=fuzz_run.tallies,
        run={"seed": plan.seed, **figures},
        config={
            "code": code,
            "plan": plan.__dict__,
            "model": MODEL,
            "broker": "mosquitto, persistence off, set_tcp_nodelay true",
            "gateway": "iotgw serve --broker (MQTT 5, QoS 1) --max-body-bytes 262144 --no-tuner "
            "(gRPC with its default limits)",
            "devices": "MQTT 5 and MQTT 3.1.1 publishers, QoS 1; replies on one MQTT 5 client",
        },
    )
    print(f"results: {path}")
    return path


def main(quick: bool = False, out_dir: Path | None = None) -> int:
    run(QUICK if quick else FULL, quick, out_dir)
    return 0


def _cli(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.fuzz", description=__doc__)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", type=Path)
    p.add_argument("--logs", type=Path, help="copy the broker's and gateways' logs here")
    args = p.parse_args(argv)
    run(QUICK if args.quick else FULL, args.quick, args.out, args.logs)
    return 0


if __name__ == "__main__":
    sys.exit(_cli())
