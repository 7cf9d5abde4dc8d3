"""``python -m benchmarks.quant [--quick] [--out DIR]``; ``--measure-memory JOBS`` is the
fresh process of ``benchmarks.quant.memory``."""

import argparse
import json
import sys

import benchmarks.quant
from benchmarks.common import bench_parser
from benchmarks.quant.memory import MEMORY_MARK, measure_memory_here

parser = bench_parser("python -m benchmarks.quant", benchmarks.quant.__doc__)
parser.add_argument("--measure-memory", help=argparse.SUPPRESS)
args = parser.parse_args()
if args.measure_memory:
    for result in measure_memory_here(json.loads(args.measure_memory)):
        print(MEMORY_MARK + json.dumps(result), flush=True)
    sys.exit(0)
sys.exit(benchmarks.quant.main(quick=args.quick, out_dir=args.out))
