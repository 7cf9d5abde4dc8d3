"""``python -m benchmarks.ingest [--quick] [--out DIR]``."""

import sys

import benchmarks.ingest
from benchmarks.common import bench_parser

args = bench_parser("python -m benchmarks.ingest", benchmarks.ingest.__doc__).parse_args()
sys.exit(benchmarks.ingest.main(quick=args.quick, out_dir=args.out))
