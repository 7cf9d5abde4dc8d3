"""The run's figures, computed from the ledger once the run is over.

Definitions (also in docs/device_sim.md):

- offered_rps: requests the plan offered in a window / the window's length.
- achieved_rps: successful replies to those requests / the time from the window's start to the
  later of its end and its last successful reply (so a server that falls behind shows a lower
  rate, and one that keeps up shows the offered rate within one request's latency).
- latency: send -> reply at the device, successful replies only; p50/p95/p99 by linear
  interpolation between order statistics (numpy's default).
- lost: no reply within the timeout. errors: replies with a status other than 200, by kind
  (the reply's ``reason``, else its status), plus transport failures (kind ``transport``).
- send_lag: how much later than planned the simulator sent (p50/p99/max); when it is large the
  generator, not the server, limited the offered rate.
- SLO: ``late`` are successful replies slower than the SLO; ``violations`` are requests that did
  not get a successful reply within the SLO: late + errors + lost + not sent.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from device_sim.ledger import Ledger, Outcome
from device_sim.plan import Plan

PERCENTILES = (50, 95, 99)


def _ms(seconds: float) -> float:
    return round(float(seconds) * 1000, 3)


def latency_figures(latencies_s: np.ndarray) -> dict[str, float] | None:
    if latencies_s.size == 0:
        return None
    p = np.percentile(latencies_s, PERCENTILES)
    return {
        "p50": _ms(p[0]),
        "p95": _ms(p[1]),
        "p99": _ms(p[2]),
        "mean": _ms(float(latencies_s.mean())),
        "min": _ms(float(latencies_s.min())),
        "max": _ms(float(latencies_s.max())),
    }


def _errors_by_kind(ledger: Ledger, mask: np.ndarray) -> dict[str, dict[str, int]]:
    kinds = ledger.kind[mask & (ledger.outcome == Outcome.ERROR)]
    out = {}
    for index in np.unique(kinds[kinds >= 0]):
        name = ledger.kinds[int(index)]
        out[name] = {"status": ledger.kind_status[name], "count": int((kinds == index).sum())}
    return out


def window_figures(
    ledger: Ledger, mask: np.ndarray, start_s: float, end_s: float, slo_s: float | None
) -> dict[str, Any]:
    outcome = ledger.outcome[mask]
    ok = outcome == Outcome.OK
    done = ledger.done_at[mask]
    latencies = (done - ledger.sent_at[mask])[ok]
    counts = {
        "planned": int(mask.sum()),
        "sent": int(np.isfinite(ledger.sent_at[mask]).sum()),
        "ok": int(ok.sum()),
        "errors": int((outcome == Outcome.ERROR).sum()),
        "lost": int((outcome == Outcome.LOST).sum()),
        "not_sent": int((outcome == Outcome.NOT_SENT).sum()),
    }
    last_ok = float(done[ok].max()) if ok.any() else end_s
    window = max(end_s, last_ok) - start_s
    slo: dict[str, Any] | None = None
    if slo_s is not None:
        late = int((latencies > slo_s).sum())
        failed = counts["errors"] + counts["lost"] + counts["not_sent"]
        violations = late + failed
        slo = {
            "slo_ms": _ms(slo_s),
            "late": late,
            "violations": violations,
            "violation_fraction": round(violations / counts["planned"], 6)
            if counts["planned"]
            else 0.0,
        }
    return {
        "start_s": round(start_s, 6),
        "duration_s": round(end_s - start_s, 6),
        "requests": counts,
        "offered_rps": round(counts["planned"] / (end_s - start_s), 3) if end_s > start_s else 0.0,
        "achieved_rps": round(counts["ok"] / window, 3) if window > 0 else 0.0,
        "latency_ms": latency_figures(latencies),
        "slo": slo,
        "errors": _errors_by_kind(ledger, mask),
    }


def timeline_bin_s(plan: Plan, ledger: Ledger) -> float:
    """1 s bins, or 0.1 s for runs shorter than 10 s so that a short run still has a shape."""
    finite_done = ledger.done_at[np.isfinite(ledger.done_at)]
    span = max(plan.duration_s, float(finite_done.max()) if finite_done.size else 0.0)
    return 1.0 if span >= 10 else 0.1


def timeline(
    plan: Plan, ledger: Ledger, bin_s: float, select: np.ndarray | None = None
) -> list[dict[str, Any]]:
    """Figures per bin of ``bin_s`` seconds over the offered window (rates per second):
    offered by planned time, achieved and errors by reply time, latency and losses by send
    time. The last bin runs on to the last reply, so replies to the last requests are counted
    where they belong instead of in an almost empty extra bin (a false drop to 0); each row's
    ``span_s`` is its length, and its rates are per second of it. ``select`` (a mask over the
    plan) counts only those requests, on the whole run's bins: one model's share."""
    n_bins = max(1, math.ceil(plan.duration_s / bin_s - 1e-9))
    finite_done = ledger.done_at[np.isfinite(ledger.done_at)]
    end = max(plan.duration_s, float(finite_done.max()) if finite_done.size else 0.0)
    chosen = np.ones(len(plan), dtype=bool) if select is None else select

    def bins(t: np.ndarray) -> np.ndarray:
        # + 1e-9: a constant process puts arrivals exactly on bin edges (0.3 / 0.1 < 3.0).
        return np.clip((t / bin_s + 1e-9).astype(np.int64), 0, n_bins - 1)

    ok = chosen & (ledger.outcome == Outcome.OK)
    sent = chosen & np.isfinite(ledger.sent_at)
    offered = np.bincount(bins(plan.times[chosen]), minlength=n_bins)
    sent_bins = bins(np.where(sent, ledger.sent_at, 0))
    sent_count = np.bincount(sent_bins[sent], minlength=n_bins)
    achieved = np.bincount(bins(ledger.done_at[ok]), minlength=n_bins)
    lost = np.bincount(sent_bins[chosen & (ledger.outcome == Outcome.LOST)], minlength=n_bins)
    err = chosen & (ledger.outcome == Outcome.ERROR)
    err_bins = bins(np.where(err, ledger.done_at, 0))
    latency = ledger.done_at - ledger.sent_at

    rows = []
    for b in range(n_bins):
        start = b * bin_s
        span = bin_s if b < n_bins - 1 else end - start
        offered_span = min(start + bin_s, plan.duration_s) - start  # the bin within the window
        in_bin = ok & (sent_bins == b) & sent
        figures = latency_figures(latency[in_bin])
        errors = {
            ledger.kinds[int(k)]: int(c)
            for k, c in zip(
                *np.unique(ledger.kind[err & (err_bins == b)], return_counts=True), strict=True
            )
        }
        rows.append(
            {
                "t": round(start, 6),
                "span_s": round(span, 6),
                "offered": int(offered[b]),
                "sent": int(sent_count[b]),
                "ok": int(achieved[b]),
                "lost": int(lost[b]),
                "errors": errors,
                "offered_rps": float(offered[b] / offered_span) if offered_span > 0 else 0.0,
                "achieved_rps": float(achieved[b] / span) if span > 0 else 0.0,
                "p50_ms": figures["p50"] if figures else None,
                "p95_ms": figures["p95"] if figures else None,
                "p99_ms": figures["p99"] if figures else None,
            }
        )
    return rows


def send_lag(plan: Plan, ledger: Ledger) -> dict[str, float] | None:
    sent = np.isfinite(ledger.sent_at)
    if not sent.any():
        return None
    lag = np.maximum(ledger.sent_at[sent] - plan.times[sent], 0.0)
    p50, p99 = np.percentile(lag, [50, 99])
    return {"p50": _ms(p50), "p99": _ms(p99), "max": _ms(float(lag.max()))}


def summarize(
    plan: Plan, ledger: Ledger, *, slo_ms: float | None, elapsed_s: float, run: dict[str, Any]
) -> dict[str, Any]:
    """The summary document: ``run`` (how it was configured), the whole-run figures, one entry
    per phase, the per-second timeline, one entry per model (its figures and timeline) and the
    reply anomalies."""
    slo_s = slo_ms / 1000 if slo_ms is not None else None
    everything = np.ones(len(plan), dtype=bool)
    summary: dict[str, Any] = {
        "run": run,
        "elapsed_s": round(elapsed_s, 3),
        **window_figures(ledger, everything, 0.0, plan.duration_s, slo_s),
        # How late the simulator itself sent requests: a large lag means the load generator,
        # not the server, limited the offered rate.
        "send_lag_ms": send_lag(plan, ledger),
        "replies": {
            "late": ledger.late_replies,
            "duplicate": ledger.duplicate_replies,
            "unmatched": ledger.unmatched_replies,
        },
    }
    summary["phases"] = [
        {
            "name": p.name,
            "process": p.process,
            "parameters": p.parameters,
            "mean_rate": p.mean_rate,
            **window_figures(
                ledger,
                plan.phase == i,
                p.start_s,
                min(p.start_s + p.duration_s, plan.duration_s),
                slo_s,
            ),
        }
        for i, p in enumerate(plan.phases)
    ]
    bin_s = timeline_bin_s(plan, ledger)
    summary["timeline_bin_s"] = bin_s
    summary["timeline"] = timeline(plan, ledger, bin_s)
    # Each model's share on the same bins: the plots draw one line per model, since a fast
    # and a slow model averaged into one line describe neither.
    summary["models"] = [
        {
            "name": name,
            **window_figures(ledger, plan.model == i, 0.0, plan.duration_s, slo_s),
            "timeline": timeline(plan, ledger, bin_s, plan.model == i),
        }
        for i, name in enumerate(plan.models)
    ]
    return summary
