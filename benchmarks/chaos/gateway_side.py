"""What the gateway itself saw of an overload case, read from its ``/metrics`` at the end: the
requests by outcome, the refusals by reason, and its own time per answered request, per batch
and in the queue. Beside the devices' figures it tells where an admitted request's time went:
inside the gateway (decode to reply handed to the broker) or outside it (the broker's queues,
the network, the device's own process)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

_HISTOGRAMS = {
    "iotgw_request_latency_seconds": "latency",
    "iotgw_queue_seconds": "queue",
    "iotgw_compute_seconds": "compute",
}


def gateway_side(exposition: str, model: str) -> dict[str, Any]:
    """Counts and cumulative histogram buckets (milliseconds) for ``model``."""
    outcomes: Counter[str] = Counter()
    rejections: Counter[str] = Counter()
    buckets: dict[str, dict[str, float]] = {name: {} for name in _HISTOGRAMS.values()}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            labels = sample.labels
            if labels.get("model") not in (None, model):
                continue
            if sample.name == "iotgw_requests_total" and labels.get("model") == model:
                outcomes[labels["outcome"]] += int(sample.value)
            elif sample.name == "iotgw_rejections_total" and labels.get("model") == model:
                rejections[labels["reason"]] += int(sample.value)
            elif sample.name.endswith("_bucket") and sample.name[:-7] in _HISTOGRAMS:
                key = _HISTOGRAMS[sample.name[:-7]]
                le = labels["le"]
                bound = "inf" if le == "+Inf" else f"{float(le) * 1e3:g}"
                buckets[key][bound] = buckets[key].get(bound, 0.0) + sample.value
    return {
        "requests": dict(sorted(outcomes.items())),
        "rejections": dict(sorted(rejections.items())),
        **{f"{key}_le_ms": {k: int(v) for k, v in b.items()} for key, b in buckets.items()},
    }


def since(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """``after`` less ``before``, count by count: what one stretch of load added (the ramp that
    measured capacity ran on the same gateway)."""
    out: dict[str, Any] = {}
    for key, counts in after.items():
        earlier = before.get(key, {})
        out[key] = {k: v - earlier.get(k, 0) for k, v in counts.items()}
    return out
