"""TensorFlow's import-time lines on stderr: what a level hides is dropped, the rest of the
process's stderr output in the same span is written on, in order."""

from __future__ import annotations

import os
import subprocess
import sys

from models.tf_env import _native_noise

BANNER = b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
INFO = b"I0000 00:00:1796415480.567255   30161 port.cc:153] oneDNN custom operations are on.\n"
WARN = b"W0000 00:00:1796415480.567300   30161 cuda_dnn.cc:8310] factory registered twice\n"
ERROR = b"E0000 00:00:1796415480.567400   30161 port.cc:99] a real error\n"


def test_a_level_hides_its_severities_and_the_banner_only() -> None:
    noise = _native_noise("IW")
    assert all(noise.match(line) for line in (BANNER, INFO, WARN))
    assert not noise.match(ERROR)
    assert not noise.match(b"2026-12-04 12:00:00 WARNING gateway: port 8080 is busy\n")
    assert _native_noise("IWE").match(ERROR)


def test_what_else_was_written_meanwhile_reaches_stderr_in_order() -> None:
    # In a child process: the block swaps file descriptor 2, which pytest's capture also holds.
    code = (
        "import os\n"
        "from models.tf_env import _native_noise, _stderr_without\n"
        "with _stderr_without(_native_noise('IW')):\n"
        f"    os.write(2, {BANNER + INFO!r})\n"
        "    os.write(2, b'kept 1\\n')\n"
        f"    os.write(2, {WARN + ERROR!r})\n"
        "    os.write(2, b'kept 2\\n')\n"
        "os.write(2, b'after\\n')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, check=True, cwd=os.getcwd()
    )
    assert done.stderr == b"kept 1\n" + ERROR + b"kept 2\nafter\n"
