"""(f) Network partitions: the broker, each gateway replica and the devices on hosts of their own
(network namespaces on one switch, ``benchmarks.chaos.netns``). Under QoS 1 load on the
replicas' shared subscription, replica 0's link is cut for longer than the broker's keep-alive
timeout (1.5 times the gateway's keep-alive: Mosquitto then drops the connection and keeps the
session) and restored; later the broker's own link is cut for a few seconds (shorter than any
keep-alive: every connection rides it out on TCP's retransmissions).

The devices' ledgers say when the other replicas took over the cut one's share
(``failover``); the broker's log says when it dropped the cut member, and each replica's
``/metrics`` what it served in each stretch."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.chaos.gateway_side import gateway_side
from benchmarks.chaos.netns import Host, Network
from benchmarks.chaos.scenarios import Action, Case, Load
from benchmarks.chaos.stack import Gateway, Mosquitto
from gateway.settings.schema import MqttSettings

# Mosquitto closes a connection it heard nothing on for one and a half keep-alives.
BROKER_TIMEOUT_FACTOR = 1.5
# ...but Mosquitto 2.0 looks for such connections only once every six seconds, on whole-second
# clocks: it closes one up to 8 s after its timeout. A cut meant to outlast the timeout outlasts
# this too.
BROKER_SWEEP_LAG_S = 8.0
# Failover counts only if the other replicas then answered every request for at least this
# long before the link came back (the held share's last request is a few ms before it).
_FAILOVER_HOLDS_S = 1.0
# A reply this soon after its request was not held, even if it came just after the restore.
_PROMPT_S = 1.0


@dataclass(frozen=True)
class PartitionPlan:
    name: str  # the case's name in the results
    rate: float  # requests per second, all device processes together
    replicas: int
    keepalive_s: int | None  # the replicas' MQTT keep-alive; None: as the gateway configures it
    session_expiry_s: int | None  # the replicas' session expiry; None: as configured
    lead_s: float  # load before the cut
    cut_beyond_timeout_s: float  # the cut lasts the broker's keep-alive timeout and this
    gap_s: float  # after the restore, before the broker's link is cut
    broker_cut_s: float
    tail_s: float  # load after the broker's link is back
    settle_s: float

    def keepalive(self) -> int:
        return self.keepalive_s or int(MqttSettings.model_fields["keepalive_s"].default)

    def session_expiry(self) -> int:
        default = int(MqttSettings.model_fields["session_expiry_s"].default)
        return default if self.session_expiry_s is None else self.session_expiry_s

    def cut_s(self) -> float:
        return BROKER_TIMEOUT_FACTOR * self.keepalive() + self.cut_beyond_timeout_s

    def duration_s(self) -> float:
        return self.lead_s + self.cut_s() + self.gap_s + self.broker_cut_s + self.tail_s


# The gateway's configured keep-alive (30 s) and session expiry (an hour): the cut lasts 60 s.
FULL_PARTITION = PartitionPlan("f_partition", 200, 3, None, None, 10, 15, 12, 3, 15, 60)
# What a replica's share does when its session ends during the cut instead: a 10 s keep-alive
# and a 5 s session expiry (Mosquitto drops the member 15 to 23 s in, its session ends 5 s later).
FULL_SHORT_SESSION = PartitionPlan(
    "f_partition_short_session", 200, 3, 10, 5, 10, 15, 12, 3, 15, 60
)
# --quick: a 5 s keep-alive (the least the gateway takes) so the cut lasts 16 s (a 12 s cut
# once ended before the sweep closed the connection).
QUICK_PARTITION = PartitionPlan(
    "f_partition", 60, 2, 5, None, 4, BROKER_SWEEP_LAG_S + 0.5, 4, 2, 4, 20
)


def partition(load: Load, repo: Path, folder: Path, plan: PartitionPlan) -> Case:
    """Run case f on a network of its own; every namespace and process is gone on return."""
    env = {
        "IOTGW_MQTT__KEEPALIVE_S": str(plan.keepalive()),
        "IOTGW_MQTT__SESSION_EXPIRY_S": str(plan.session_expiry()),
    }
    folder = folder / plan.name
    with Network() as net:
        broker_host = net.add_host("broker")
        devices = net.add_host("devices")
        hosts = [net.add_host(f"replica{i}") for i in range(plan.replicas)]
        gateways: list[Gateway] = []
        broker = Mosquitto(folder, host=broker_host)
        try:
            for i, host in enumerate(hosts):
                gateway = Gateway(
                    repo, folder, client_id=f"chaos-f{i}", broker=broker.url, host=host, env=env
                )
                gateways.append(gateway)
                gateway.start()
            served: dict[str, list[dict[str, int]]] = {}
            cut_host = hosts[0]

            def read_served(stretch: str) -> Callable[[], None]:
                def read() -> None:
                    served[stretch] = [_requests(g, load.model) for g in gateways]

                return read

            actions = _timeline(plan, net, cut_host, broker_host, read_served)
            duration = plan.duration_s()
            jobs = load.jobs(
                broker.port,
                duration_s=duration,
                rate=plan.rate,
                settle_s=plan.settle_s,
                broker_host=broker_host.address,
                netns=devices.namespace,
            )
            epoch_offset = time.time() - time.monotonic()
            ledgers, events = load.run(jobs, actions)
            read_served("end")()
            broker_log = broker.log_text()
            logs = [g.process.log_text() if g.process else "" for g in gateways]
            reconnects = [log.count("MQTT: connection to") for log in logs]
        finally:
            for gateway in gateways:
                gateway.stop()
            broker.stop()
    config = _config(plan, broker_log, epoch_offset, served, reconnects)
    return Case(plan.name, ledgers, events, config)


def _timeline(
    plan: PartitionPlan,
    net: Network,
    cut_host: Host,
    broker_host: Host,
    read_served: Callable[[str], Callable[[], None]],
) -> list[Action]:
    """The cut and restore of replica 0's link (each followed by a reading of what every
    replica served), then the broker's short cut, at their fractions of the load window."""

    def cut() -> None:
        net.cut(cut_host)  # first: the event's time is the cut's
        read_served("before_cut")()

    def restore() -> None:
        net.restore(cut_host)
        read_served("during_cut")()

    t_cut = plan.lead_s
    t_restore = t_cut + plan.cut_s()
    t_broker = t_restore + plan.gap_s
    duration = plan.duration_s()
    return [
        (t_cut / duration, "replica 0 link cut", cut),
        (t_restore / duration, "replica 0 link restored", restore),
        (t_broker / duration, "broker link cut", lambda: net.cut(broker_host)),
        (
            (t_broker + plan.broker_cut_s) / duration,
            "broker link restored",
            lambda: net.restore(broker_host),
        ),
    ]


def _config(
    plan: PartitionPlan,
    broker_log: str,
    epoch_offset: float,
    served: dict[str, list[dict[str, int]]],
    reconnects: list[int],
) -> dict[str, Any]:
    return {
        "rate": plan.rate,
        "replicas": plan.replicas,
        "gateway_keepalive_s": plan.keepalive(),
        "gateway_session_expiry_s": plan.session_expiry(),
        "replica_cut_s": plan.cut_s(),
        "broker_cut_s": plan.broker_cut_s,
        "broker": "mosquitto " + _mosquitto_version(broker_log),
        "broker_dropped": _broker_drops(broker_log, epoch_offset),
        "gateway_requests": _per_stretch(served),
        # Connections each replica lost (its log's warnings): the cut one's, and any other.
        "gateway_connections_lost": reconnects,
        "plan": asdict(plan),
    }


def _requests(gateway: Gateway, model: str) -> dict[str, int]:
    """The replica's requests by outcome so far (0s if it cannot be read, e.g. while cut)."""
    try:
        counts: dict[str, int] = gateway_side(gateway.metrics(), model)["requests"]
    except OSError:
        return {}
    return counts


def _per_stretch(served: dict[str, list[dict[str, int]]]) -> dict[str, list[dict[str, int]]]:
    """What each replica served between the readings: before the cut, during it, after."""
    order = ["before_cut", "during_cut", "end"]
    out: dict[str, list[dict[str, int]]] = {}
    previous: list[dict[str, int]] | None = None
    for name in order:
        now = served.get(name)
        if now is None:
            continue
        if previous is None:
            out[name] = now
        else:
            out["after_restore" if name == "end" else name] = [
                {k: v - before.get(k, 0) for k, v in counts.items()}
                for counts, before in zip(now, previous, strict=True)
            ]
        previous = now
    return out


# What Mosquitto logs when it closes a connection for its keep-alive, and when a session it
# kept for an offline client expires.
_DROPS = re.compile(
    r"^(\d+): (?:Client (\S+) has (exceeded timeout), disconnecting|"
    r"(Expiring) client (\S+) due to timeout)\.",
    re.MULTILINE,
)


def _broker_drops(log: str, epoch_offset: float) -> list[dict[str, Any]]:
    """Each connection Mosquitto closed for its keep-alive and each session it expired: who,
    what, and when (``time.monotonic()`` of this process, to the second: Mosquitto logs whole
    seconds)."""
    return [
        {
            "client": m.group(2) or m.group(5),
            "what": "connection closed (keep-alive)" if m.group(3) else "session expired",
            "at": int(m.group(1)) - epoch_offset,
        }
        for m in _DROPS.finditer(log)
    ]


def _mosquitto_version(log: str) -> str:
    match = re.search(r"mosquitto version (\S+)", log)
    return match.group(1) if match else "(version not logged)"


def failover(
    sent_at: np.ndarray, replied_at: np.ndarray, cut_at: float, restore_at: float
) -> dict[str, Any]:
    """From the devices' ledger: when, after the cut, every request was again answered while
    the cut replica could answer none (before the restore).

    A request sent during the cut and answered neither before the restore nor within
    ``_PROMPT_S`` (or not at all) was held for the cut replica (its share of the shared
    subscription). The failover instant is the send time of the first request after the last
    such one; it counts only if the others then answered everything for ``_FAILOVER_HOLDS_S``
    before the link came back, else there was none (``partition_failover_s`` None: the broker
    held the cut member's share until it came back). ``held_wait_max_s``: the longest a held
    request waited for its reply."""
    window = (sent_at >= cut_at) & (sent_at < restore_at)
    replied = np.nan_to_num(replied_at, nan=np.inf)
    prompt = (replied < restore_at) | (replied - sent_at <= _PROMPT_S)
    held = window & ~prompt
    failover_at: float | None = cut_at
    if held.any():
        last_held = float(sent_at[held].max())
        after = sent_at[window & (sent_at > last_held)]
        failover_at = float(after.min()) if after.size else None
    if failover_at is not None and restore_at - failover_at < _FAILOVER_HOLDS_S:
        failover_at = None
    waits = replied_at[held] - sent_at[held]
    waits = waits[~np.isnan(waits)]
    return {
        "partition_failover_s": None if failover_at is None else round(failover_at - cut_at, 2),
        "sent_during_cut": int(window.sum()),
        "held_for_cut_replica": int(held.sum()),
        "held_answered_after_restore": int((held & ~np.isnan(replied_at)).sum()),
        "held_wait_max_s": round(float(waits.max()), 2) if waits.size else None,
    }
