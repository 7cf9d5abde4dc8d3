"""``run_bench`` fails a test on a command that hangs or exits non-zero, and says why."""

from __future__ import annotations

import pytest

from tests.benchmarks.bench_process import run_bench


def test_a_hung_command_fails_with_every_threads_stack() -> None:
    with pytest.raises(pytest.fail.Exception) as failed:
        run_bench("timeit", "-n1", "-r1", "import time; time.sleep(60)", limit_s=2.0)
    message = str(failed.value)
    assert "timeit -n1 -r1 import time; time.sleep(60) ran past 2 s" in message
    # faulthandler's dump: the thread that slept, in the code that slept.
    assert "Fatal Python error: Aborted" in message
    assert 'File "<timeit-src>", line 6 in inner' in message


def test_an_error_exit_fails_with_its_output() -> None:
    with pytest.raises(pytest.fail.Exception) as failed:
        run_bench("timeit", "-n1", "-r1", "raise SystemExit('no model here')")
    assert "exited 1" in str(failed.value) and "no model here" in str(failed.value)


def test_a_command_that_succeeds_returns_its_output() -> None:
    proc = run_bench("timeit", "-n1", "-r1", "pass")
    assert proc.returncode == 0 and "1 loop" in proc.stdout
