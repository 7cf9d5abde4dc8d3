"""``python -m benchmarks.find [--quick] [--out DIR] [--models M] [--loads L] [--starts S]``."""

import sys

from benchmarks.find.run import cli

sys.exit(cli())
