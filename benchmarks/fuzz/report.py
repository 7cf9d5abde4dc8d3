"""Counting what each send got back, per transport, with a few examples of every kind of
failure (payload truncated), and the results file."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import format_table, write_results
from benchmarks.fuzz.cases import Case, GrpcCase, HttpCase
from benchmarks.fuzz.judge import OK, OVERLOAD, REFUSED, WRONG
from benchmarks.fuzz.transports import DOWN, RESET, STUCK, UNROUTED

EXAMPLES_PER_KIND = 12
PREVIEW_BYTES = 240


def describe(case: Case) -> dict[str, Any]:
    """A case as it goes in the results: where it went and its payload, truncated."""
    if isinstance(case, HttpCase):
        where: dict[str, Any] = {"path": case.path, "headers": dict(case.headers)}
        payload = case.body
    elif isinstance(case, GrpcCase):
        where, payload = {"grpc": case.method}, case.body
    else:
        where = {
            "mqtt": "5" if case.v5 else "3.1.1",
            "topic": case.topic[:120],
            "response_topic": case.response_topic,
            "correlation_bytes": None if case.correlation is None else len(case.correlation),
            "content_type": case.content_type,
            "expiry_s": case.expiry_s,
            "user_properties": len(case.user_properties),
        }
        payload = case.payload
    preview = payload[:PREVIEW_BYTES].decode("utf-8", errors="backslashreplace")
    return {"family": case.family, **where, "bytes": len(payload), "payload": preview}


@dataclass
class Tally:
    payloads: int = 0
    good_sent: int = 0
    good_answered: int = 0
    resets: int = 0
    stuck: int = 0
    non_4xx_for_bad_input: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    by_family: dict[str, Counter[str]] = field(default_factory=dict)
    examples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    _seen: set[tuple[str, str, str]] = field(default_factory=set)

    def record(self, case: Case, good: bool, outcome: str, why: str) -> None:
        self.outcomes[outcome] += 1
        if good:
            self.good_sent += 1
            self.good_answered += outcome == OK
            if outcome != OK:
                self._example("good_not_answered", case, why)
        else:
            self.payloads += 1
            self.by_family.setdefault(case.family, Counter())[outcome] += 1
        if outcome == STUCK:
            self.stuck += 1
            self._example("stuck", case, why)
        elif outcome == RESET:
            self.resets += 1
            self._example("reset", case, why)
        elif outcome == WRONG and not good:
            self.non_4xx_for_bad_input += 1
            self._example("non_4xx_for_bad_input", case, why)

    def _example(self, kind: str, case: Case, why: str) -> None:
        key = (kind, case.family, why[:60])
        found = self.examples.setdefault(kind, [])
        if key not in self._seen and len(found) < EXAMPLES_PER_KIND:
            self._seen.add(key)
            found.append({"why": why[:PREVIEW_BYTES], **describe(case)})

    def as_dict(self) -> dict[str, Any]:
        return {
            "payloads": self.payloads,
            "crashes": self.resets,  # per transport: connections reset without a reply
            "stuck": self.stuck,
            "non_4xx_for_bad_input": self.non_4xx_for_bad_input,
            "good_sent": self.good_sent,
            "good_answered": self.good_answered,
            "outcomes": dict(self.outcomes),
            "by_family": {k: dict(v) for k, v in sorted(self.by_family.items())},
            "examples": self.examples,
        }


OUTCOMES = (OK, REFUSED, OVERLOAD, WRONG, STUCK, RESET, DOWN, UNROUTED)


def print_table(tallies: dict[str, Tally]) -> None:
    rows = [
        [name, t.payloads, *(t.outcomes[o] for o in OUTCOMES), f"{t.good_answered}/{t.good_sent}"]
        for name, t in tallies.items()
    ]
    print(format_table(["transport", "payloads", *OUTCOMES, "good"], rows))


def write(
    *,
    quick: bool,
    out_dir: Path | None,
    machine: dict[str, Any],
    tallies: dict[str, Tally],
    run: dict[str, Any],
    config: dict[str, Any],
) -> Path:
    good_sent = sum(t.good_sent for t in tallies.values()) + run["final_good_sent"]
    good_answered = sum(t.good_answered for t in tallies.values()) + run["final_good_answered"]
    summary = {
        "payloads": sum(t.payloads for t in tallies.values()),
        "crashes": run["gateway_exits"] + sum(t.resets for t in tallies.values()),
        "stuck": sum(t.stuck for t in tallies.values()),
        "non_4xx_for_bad_input": sum(t.non_4xx_for_bad_input for t in tallies.values()),
        "good_answered_ratio": round(good_answered / good_sent, 6) if good_sent else None,
        "gateway_exits": run["gateway_exits"],
        "gateway_restarts": len(run["restarts"]),
        "final_ready": run["final_ready"],
        "final_good_answered": run["final_good_answered"],
        "final_good_sent": run["final_good_sent"],
    }
    return write_results(
        "fuzz",
        quick=quick,
        out_dir=out_dir,
        machine=machine,
        summary=summary,
        runs=[{k: v for k, v in run.items() if k != "restarts"}],
        config=config,
        transports={name: t.as_dict() for name, t in tallies.items()},
        restarts=run["restarts"],
    )
