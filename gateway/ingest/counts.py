"""Counters an ingest process keeps (error replies, MQTT duplicates and reconnects) travel to
the serving process as increments, so ``/metrics`` (served there) counts the whole gateway.
Gauges stay where they are (the serving process's describe the serving process), except each
ingest process's MQTT session state, which it reports itself (``frames.STATE``)."""

from __future__ import annotations

from prometheus_client import Counter

from gateway.metrics import GatewayMetrics

# {counter family: {label values: value}}
Counts = dict[str, dict[tuple[str, ...], float]]


def counters_by_name(metrics: GatewayMetrics) -> dict[str, Counter]:
    return {c._name: c for c in vars(metrics).values() if isinstance(c, Counter)}


def totals(metrics: GatewayMetrics) -> Counts:
    """Every counter's value per label set, as it stands."""
    out: Counts = {}
    for name, counter in counters_by_name(metrics).items():
        labelnames = counter._labelnames
        series: dict[tuple[str, ...], float] = {}
        for family in counter.collect():
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    series[tuple(sample.labels[n] for n in labelnames)] = sample.value
        if series:
            out[name] = series
    return out


def increments(now: Counts, before: Counts) -> Counts:
    """What grew since ``before``: the message an ingest process sends."""
    out: Counts = {}
    for name, series in now.items():
        old = before.get(name, {})
        grown = {k: v - old.get(k, 0.0) for k, v in series.items() if v > old.get(k, 0.0)}
        if grown:
            out[name] = grown
    return out


def add(counters: dict[str, Counter], counts: Counts) -> None:
    for name, series in counts.items():
        counter = counters.get(name)
        if counter is None:
            continue  # a counter this process does not have: ignore, never fail
        for labels, increment in series.items():
            if increment > 0:
                (counter.labels(*labels) if labels else counter).inc(increment)
