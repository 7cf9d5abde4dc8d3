"""The console headline of ``iotgw sim run``, from the summary document.

Its first line says what carried the requests; then one line per phase (and, in a run of
several models, per model) that says the whole story of that part of the run: offered against
achieved rate, p50/p99 at the device, and what failed, by kind. A person reads those first; the
whole-run counts follow.
"""

from __future__ import annotations

from typing import Any

from device_sim.runner import transport_line


def _short(x: float) -> str:
    """Three significant digits (``0.853``, ``12.3``, ``99.9``), whole numbers from 1,000."""
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:,.0f}"


def _latency(figures: dict[str, Any]) -> str:
    latency = figures["latency_ms"]
    if latency is None:
        return "no successful reply"
    return f"p50 {_short(latency['p50'])} ms, p99 {_short(latency['p99'])} ms"


def failures(figures: dict[str, Any], timeout_s: float | None) -> str:
    """``no errors or timeouts``, else each kind with its count: the gateway's refusals by
    reason and status, requests without a reply (timeouts), and those the simulator's own
    in-flight bound kept back."""
    parts = [f"{kind} ({e['status']}) {e['count']}" for kind, e in figures["errors"].items()]
    requests = figures["requests"]
    if requests["lost"]:
        within = f" in {timeout_s:g} s" if timeout_s is not None else ""
        parts.append(f"timed out (no reply{within}) {requests['lost']}")
    if requests["not_sent"]:
        parts.append(f"not sent (--max-in-flight) {requests['not_sent']}")
    return "errors: " + ", ".join(parts) if parts else "no errors or timeouts"


def figures_line(label: str, figures: dict[str, Any], timeout_s: float | None) -> str:
    """``<label>: offered 100 req/s, achieved 99.8 req/s, p50 2.1 ms, p99 7.4 ms; <failures>``."""
    return (
        f"{label}: offered {_short(figures['offered_rps'])} req/s, "
        f"achieved {_short(figures['achieved_rps'])} req/s, {_latency(figures)}; "
        f"{failures(figures, timeout_s)}"
    )


def phase_name(phase: dict[str, Any]) -> str:
    """``phase burst (onoff 20/s)``; a replay: ``trace replay (speed 2)``."""
    if phase.get("process") in (None, "trace"):
        speed = (phase.get("parameters") or {}).get("speed")
        return f"trace replay (speed {speed:g})" if speed is not None else str(phase["name"])
    return f"phase {phase['name']} ({phase['process']} {phase.get('mean_rate', 0):g}/s)"


def headline(summary: dict[str, Any]) -> str:
    run = summary["run"]
    timeout_s = run.get("timeout_s")
    lines = [f"transport: {transport_line(run)}"]
    lines += [figures_line(phase_name(p), p, timeout_s) for p in summary["phases"]]
    models = summary.get("models") or []
    if len(models) > 1:
        lines += [figures_line(f"model {m['name']}", m, timeout_s) for m in models]
    if len(summary["phases"]) > 1:
        lines.append(figures_line("whole run", summary, timeout_s))
    r = summary["requests"]
    lat = summary["latency_ms"]
    latency = f"p50 {lat['p50']} ms, p95 {lat['p95']} ms, p99 {lat['p99']} ms" if lat else "none"
    lines += [
        f"requests: {r['planned']} planned, {r['sent']} sent, {r['ok']} ok, "
        f"{r['errors']} errors, {r['lost']} lost, {r['not_sent']} not sent",
        f"latency (whole run): {latency}",
    ]
    if summary["slo"]:
        s = summary["slo"]
        lines.append(f"SLO {s['slo_ms']} ms: {s['late']} late, {s['violations']} violations")
    return "\n".join(lines)
