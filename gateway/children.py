"""Child processes that die with the gateway: the embedded broker and the ingest processes.

Without this a SIGKILLed gateway would leave its children running and holding their ports, so
the next start fails. The kernel's parent-death signal (``PR_SET_PDEATHSIG``) does it, and it
must be asked for by the child itself, between fork and exec. ``setpriv --pdeathsig`` (util-linux
2.33 and later, on every supported Debian and Ubuntu) asks for it and then execs the real
program, so no Python runs in the child: a ``preexec_fn`` makes the standard loop fork through
Python, which runs the process's at-fork handlers in the child, and gRPC's start a poller
thread there that aborts the child once it closes its inherited descriptors before exec (an
embedded broker that never started; measured in docs/architecture.md). Without a
``preexec_fn`` the standard loop starts children with vfork, which runs no handlers. uvloop
forks through Python either way, but closes no descriptors in the child. Where setpriv is
missing, a ``preexec_fn`` makes the same call.

The kernel sends the signal when the *thread* that started the child exits; the event loop's
thread starts them here, and it lives as long as the gateway."""

from __future__ import annotations

import ctypes
import ctypes.util
import shutil
import signal
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


def _setpriv() -> str | None:
    """setpriv's path on Linux, where the parent-death signal exists."""
    return shutil.which("setpriv") if sys.platform.startswith("linux") else None


def dying_with_parent(argv: Sequence[str]) -> tuple[list[str], Callable[[], None] | None]:
    """(the command line to start, the ``preexec_fn`` to start it with) for a child that gets
    SIGTERM when the gateway dies. The child keeps the pid it is started with: setpriv execs."""
    setpriv = _setpriv()
    if setpriv is not None:
        return [setpriv, "--pdeathsig", "TERM", "--", *argv], None
    return list(argv), die_with_parent
