import sys

from benchmarks.chaos import cli

sys.exit(cli())
