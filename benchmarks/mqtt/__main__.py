"""``python -m benchmarks.mqtt [--quick] [--out DIR]``."""

import sys

import benchmarks.mqtt
from benchmarks.common import bench_parser

args = bench_parser("python -m benchmarks.mqtt", benchmarks.mqtt.__doc__).parse_args()
sys.exit(benchmarks.mqtt.main(quick=args.quick, out_dir=args.out))
