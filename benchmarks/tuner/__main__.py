import sys

from benchmarks.tuner.run import cli

sys.exit(cli())
