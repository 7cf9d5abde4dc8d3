"""``python -m benchmarks.gpu [--quick] [--out DIR]``."""

import sys

import benchmarks.gpu
from benchmarks.common import bench_parser

args = bench_parser("python -m benchmarks.gpu", benchmarks.gpu.__doc__).parse_args()
sys.exit(benchmarks.gpu.main(quick=args.quick, out_dir=args.out))
