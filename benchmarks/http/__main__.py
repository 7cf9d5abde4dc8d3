"""``python -m benchmarks.http [--quick] [--out DIR]``."""

import sys

import benchmarks.http
from benchmarks.common import bench_parser

args = bench_parser("python -m benchmarks.http", benchmarks.http.__doc__).parse_args()
sys.exit(benchmarks.http.main(quick=args.quick, out_dir=args.out))
