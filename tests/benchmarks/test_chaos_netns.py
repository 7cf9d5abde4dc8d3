"""The namespace network of ``iotgw bench chaos`` case f (``benchmarks.chaos.netns``): hosts
reach each other through the switch, a cut link carries nothing until it is restored (and the
TCP connection survives it), and no namespace outlives its network or a run that died."""

from __future__ import annotations

import os
import socket
import subprocess

import pytest

from benchmarks.chaos import netns

try:
    netns.check_available()
    _UNAVAILABLE = ""
except netns.NamespacesUnavailable as exc:
    _UNAVAILABLE = str(exc)

pytestmark = pytest.mark.skipif(bool(_UNAVAILABLE), reason=f"no network namespaces: {_UNAVAILABLE}")


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in out.stdout.splitlines() if line.strip()}


def test_a_cut_link_carries_nothing_until_restored() -> None:
    with netns.Network() as net:
        server_host, client_host = net.add_host("broker"), net.add_host("devices")
        assert {server_host.namespace, client_host.namespace, net.switch} <= _namespaces()

        def listen() -> socket.socket:
            server = socket.socket()
            server.bind((server_host.address, 1883))
            server.listen()
            return server

        server = netns.run_inside(server_host.namespace, listen)
        with netns.entered(client_host.namespace):
            client = socket.create_connection((server_host.address, 1883), timeout=5)
        # The thread came back to its own namespace: the switch's addresses are not here.
        assert (
            server_host.address
            not in subprocess.run(
                ["ip", "-brief", "addr"], capture_output=True, text=True, check=True
            ).stdout
        )
        accepted, _ = server.accept()
        accepted.settimeout(0.5)
        net.cut(server_host)
        client.sendall(b"during the cut")
        with pytest.raises(TimeoutError):
            accepted.recv(64)
        net.restore(server_host)
        accepted.settimeout(15)  # TCP's retransmission brings it once the link is back
        assert accepted.recv(64) == b"during the cut"
        for sock in (client, accepted, server):
            sock.close()
    assert not {server_host.namespace, client_host.namespace, net.switch} & _namespaces()


def test_a_dead_runs_namespaces_are_removed_and_a_live_ones_kept() -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    leftover = f"{netns.PREFIX}{dead.pid}-replica0"
    alive = f"{netns.PREFIX}{os.getpid()}-kept"
    for name in (leftover, alive):
        subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        removed = netns.remove_leftovers()
        assert leftover in removed and alive not in removed
        assert alive in _namespaces() and leftover not in _namespaces()
    finally:
        for name in (leftover, alive):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


def test_a_host_role_must_be_a_short_name() -> None:
    with netns.Network() as net, pytest.raises(ValueError, match="host role"):
        net.add_host("replica/0")
