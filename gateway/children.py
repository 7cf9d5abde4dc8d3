"""Child processes that die with the gateway: the embedded broker and the ingest processes.

Without this a SIGKILLed gateway would leave its children running and holding their ports, so
the next start fails. The kernel's parent-death signal (``PR_SET_PDEATHSIG``) does it, and it
must be asked for by the child itself, between fork and exec. ``setpriv --pdeathsig`` (util-linux,
present on every Debian and Ubuntu) asks for it and then execs the real program, so the gateway
need not run Python in the child. A ``preexec_fn`` makes the standard loop fork through Python,
which runs the process's at-fork handlers in the child; gRPC's (the gateway serves gRPC) start
its poller thread again there, the child then closes every inherited descriptor before exec,
and the poller, its epoll descriptor gone, aborts the child: 7-12 of 1,500 children with a gRPC
server up died of SIGABRT after an ``epoll_wait error: Bad file descriptor`` line (none of 3,000
when the child kept its descriptors), and one was an embedded broker that never started.
Without a ``preexec_fn`` the standard loop starts children with vfork, which runs no handlers,
and about 2.5 times faster. uvloop forks through Python either way (it runs the at-fork
handlers for every child) but closes no descriptors in the child: none of 4,500 aborted. Where
setpriv is missing, a ``preexec_fn`` makes the same call.

The kernel sends the signal when the *thread* that started the child exits; the event loop's
thread starts them here, and it lives as long as the gateway."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent() -> None:
    """The fallback, run in the child between fork and exec. Only the prctl call runs here:
    after a fork in a threaded process the child may take no lock another thread held."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _load_prctl() -> Callable[..., int] | None:
    # Looked up in the parent: the child must not load libraries between fork and exec.
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    libc = ctypes.CDLL(name, use_errno=True)
    return getattr(libc, "prctl", None)


_prctl = _load_prctl() if sys.platform.startswith("linux") else None


@functools.cache
def _setpriv() -> str | None:
    """setpriv's path where it can set the parent-death signal (util-linux 2.33 and later)."""
    found = shutil.which("setpriv")
    if found is None or not sys.platform.startswith("linux"):
        return None
    try:
        usage = subprocess.run([found, "--help"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return found if "--pdeathsig" in usage.stdout else None


def dying_with_parent(argv: Sequence[str]) -> tuple[list[str], Callable[[], None] | None]:
    """(the command line to start, the ``preexec_fn`` to start it with) for a child that gets
    SIGTERM when the gateway dies. The child keeps the pid it is started with: setpriv execs."""
    setpriv = _setpriv()
    if setpriv is not None:
        return [setpriv, "--pdeathsig", "TERM", "--", *argv], None
    return list(argv), die_with_parent
