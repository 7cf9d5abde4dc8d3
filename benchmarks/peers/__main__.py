"""``python -m benchmarks.peers [--quick] [--out DIR]``."""

import sys

import benchmarks.peers
from benchmarks.common import bench_parser

args = bench_parser("python -m benchmarks.peers", benchmarks.peers.__doc__).parse_args()
sys.exit(benchmarks.peers.main(quick=args.quick, out_dir=args.out))
