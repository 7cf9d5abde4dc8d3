"""``python -m benchmarks.grpc [--quick] [--out DIR]``."""

import sys

import benchmarks.grpc
from benchmarks.common import bench_parser

args = bench_parser("python -m benchmarks.grpc", benchmarks.grpc.__doc__).parse_args()
sys.exit(benchmarks.grpc.main(quick=args.quick, out_dir=args.out))
