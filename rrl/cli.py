"""``iotgw profile`` and ``iotgw tune``: the tuner's offline commands (no gateway involved)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="iotgw", description="RRL tuner: offline commands")
    sub = parser.add_subparsers(dest="command", required=True)
    from rrl.offline import evaluate, profiling

    p = sub.add_parser(
        "profile",
        help="measure the runtime for every configuration at several loads",
        description=(profiling.__doc__ or "").split("\n\n")[0],
    )
    profiling.add_arguments(p)
    t = sub.add_parser(
        "tune",
        help="evaluate every tuner on the offline testbed (--evaluate)",
        description=(evaluate.__doc__ or "").split("\n\n")[0],
    )
    evaluate.add_arguments(t)
    args = parser.parse_args(list(argv))
    if args.command == "profile":
        return profiling.run(args)
    return evaluate.run(args)
