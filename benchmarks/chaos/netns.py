"""A small network of Linux network namespaces for ``iotgw bench chaos`` case f: one namespace
per host (the broker, each gateway replica, the devices), each wired by a veth pair to a bridge
in a "switch" namespace of its own. Cutting a host's link sets the switch side of its veth
down: the cable pulled at the switch. Neither end's TCP connections are told anything; packets
are dropped until the link comes back, then TCP's retransmissions carry on.

Nothing touches the root namespace's interfaces: every address lives inside the run's own
namespaces, so concurrent runs may use the same subnet. Names carry this process's pid
(``iotgwp<pid>-<host>``); a run first removes the namespaces of runs whose process is gone.
Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and iproute2's ``ip``."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

PREFIX = "iotgwp"
SUBNET = "10.77.0"  # /24, private to each run's switch
_CLONE_NEWNET = 0x40000000
_NETNS_DIR = Path("/run/netns")
_T = TypeVar("_T")


class NamespacesUnavailable(RuntimeError):
    """The machine cannot make network namespaces (not root, no ``ip``, a locked-down
    container)."""


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip() or proc.returncode}")


def check_available() -> None:
    """Raise ``NamespacesUnavailable`` with the reason unless ``ip netns add`` works here."""
    if shutil.which("ip") is None:
        raise NamespacesUnavailable("iproute2's ip is not installed")
    if os.geteuid() != 0:
        raise NamespacesUnavailable("network namespaces need root")
    probe = f"{PREFIX}{os.getpid()}-probe"
    try:
        _ip("netns", "add", probe)
    except RuntimeError as exc:
        raise NamespacesUnavailable(str(exc)) from None
    _ip("netns", "del", probe)


def remove_leftovers() -> list[str]:
    """Delete the namespaces a run whose process is gone left behind (a SIGKILLed bench);
    returns their names. The veths inside go with them."""
    removed = []
    names = os.listdir(_NETNS_DIR) if _NETNS_DIR.is_dir() else []
    for name in names:
        match = re.fullmatch(rf"{PREFIX}(\d+)-.+", name)
        if match is None or _alive(int(match.group(1))):
            continue
        with contextlib.suppress(RuntimeError):
            _ip("netns", "del", name)
            removed.append(name)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def enter(name: str) -> None:
    """Move the calling thread into namespace ``name`` (threads it starts later follow it)."""
    fd = os.open(_NETNS_DIR / name, os.O_RDONLY)
    try:
        _setns(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def entered(name: str | None) -> Iterator[None]:
    """The calling thread inside namespace ``name`` for the block, back where it was after
    (``None``: stay)."""
    if name is None:
        yield
        return
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        enter(name)
        try:
            yield
        finally:
            _setns(home)
    finally:
        os.close(home)


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def run_inside(name: str, work: Callable[[], _T]) -> _T:
    """``work()`` on a thread of its own inside namespace ``name`` (this thread stays put)."""
    box: dict[str, object] = {}

    def target() -> None:
        try:
            enter(name)
            box["value"] = work()
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=target, name=f"netns-{name}", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]


@dataclass(frozen=True)
class Host:
    role: str  # e.g. "broker", "replica0", "devices"
    namespace: str
    address: str  # its IPv4 address on the switch
    switch_port: str  # the switch side of its veth: what a cut sets down

    def exec_argv(self, argv: list[str]) -> list[str]:
        """``argv`` run inside this host's namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]


class Network:
    """The switch and its hosts; ``close`` (or leaving ``with``) deletes every namespace it
    made, after its callers stopped the processes inside."""

    def __init__(self) -> None:
        check_available()
        remove_leftovers()
        self._tag = f"{PREFIX}{os.getpid()}"
        self.hosts: dict[str, Host] = {}
        self._namespaces: list[str] = []
        self.switch = self._namespace("switch")
        try:
            _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "br0", "up")
        except BaseException:
            self.close()
            raise

    def _namespace(self, role: str) -> str:
        name = f"{self._tag}-{role}"
        with contextlib.suppress(RuntimeError):
            _ip("netns", "del", name)  # this pid's own, from an earlier run in this process
        _ip("netns", "add", name)
        self._namespaces.append(name)
        _ip("-n", name, "link", "set", "lo", "up")
        return name

    def add_host(self, role: str) -> Host:
        if not re.fullmatch(r"[a-z0-9]{1,10}", role) or role in self.hosts or role == "switch":
            raise ValueError(f"host role {role!r}: 1-10 of a-z0-9, once each")
        number = len(self.hosts) + 1
        if number > 250:
            raise ValueError("at most 250 hosts on one switch")
        namespace = self._namespace(role)
        # Both ends are made inside the run's namespaces (nothing appears in the root one), so
        # short fixed interface names cannot collide with another run's.
        inside, port = "eth0", f"port{number}"
        peer = ("peer", "name", port, "netns", self.switch)
        _ip("link", "add", inside, "netns", namespace, "type", "veth", *peer)
        _ip("-n", self.switch, "link", "set", port, "master", "br0")
        _ip("-n", self.switch, "link", "set", port, "up")
        address = f"{SUBNET}.{number}"
        _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", inside)
        _ip("-n", namespace, "link", "set", inside, "up")
        host = Host(role, namespace, address, port)
        self.hosts[role] = host
        return host

    def cut(self, host: Host) -> None:
        _ip("-n", self.switch, "link", "set", host.switch_port, "down")

    def restore(self, host: Host) -> None:
        _ip("-n", self.switch, "link", "set", host.switch_port, "up")

    def close(self) -> None:
        for name in reversed(self._namespaces):
            with contextlib.suppress(RuntimeError):
                _ip("netns", "del", name)
        self._namespaces.clear()

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
