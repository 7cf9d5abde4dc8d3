"""The doc tests' summary: how many documented shell blocks ran and how many were skipped, and
why, at the end of the test run's output."""

from __future__ import annotations

from collections import Counter

import pytest


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    from tests.docs.test_documented_commands import RESULTS, SHELL_BLOCKS

    if not RESULTS:
        return
    ran = sum(1 for _, outcome in RESULTS if outcome == "ran")
    skipped = Counter(outcome for _, outcome in RESULTS if outcome != "ran")
    terminalreporter.write_sep("-", "documented shell blocks")
    terminalreporter.write_line(
        f"{ran} ran, {sum(skipped.values())} skipped as marked, "
        f"{len(SHELL_BLOCKS) - len(RESULTS)} not reached (of {len(SHELL_BLOCKS)})"
    )
    for outcome, count in sorted(skipped.items()):
        terminalreporter.write_line(f"  {count} x {outcome}")
