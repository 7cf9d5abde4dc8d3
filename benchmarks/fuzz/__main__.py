"""``python -m benchmarks.fuzz [--quick] [--out DIR]``."""

import sys

from benchmarks.fuzz import _cli

sys.exit(_cli())
