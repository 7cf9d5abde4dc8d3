import sys

from benchmarks.tuner.cli import cli

sys.exit(cli())
