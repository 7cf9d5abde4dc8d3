// iotgw live dashboard: polls the gateway's one JSON document (admin/dashboard.json, the same one
// the tests read) and redraws. Every value reaches the page through textContent, never as HTML,
// so a model name or a reason cannot inject markup.
"use strict";

const DATA_URL = "admin/dashboard.json";
const POLL_MS = 1000;
const TREND_POINTS = 60; // the gateway's per-second history of each model (history_per_s)
const TOKEN_KEY = "iotgw.adminToken";
const DASH = "\u2013"; // what the page shows where there is no value (an idle model's p95)

const lastBatches = new Map(); // "model/version" -> {count, rows} at the previous poll
let lastGrpc = null; // {requests, time} at the previous poll
const tunerOpen = new Map(); // model -> open or folded, once the operator chose
let showIdle = false; // the idle models' rows, folded until asked for
let timer = null;

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function fmt(value, digits = 1) {
  if (value === null || value === undefined || Number.isNaN(value)) return DASH;
  return Number(value).toFixed(digits);
}

function busy(stats) {
  return Boolean(stats) && (stats.completed > 0 || stats.arrived > 0);
}

function knobText(knobs) {
  if (!knobs) return DASH;
  const short = {
    max_batch_size: "batch",
    batch_timeout_ms: "timeout_ms",
    concurrency: "conc",
    intra_op_threads: "intra",
    inter_op_threads: "inter",
  };
  return Object.entries(knobs)
    .map(([name, value]) => `${short[name] || name}=${Number(value).toFixed(name === "batch_timeout_ms" ? 2 : 0)}`)
    .join(" ");
}

function setStatus(text, kind) {
  const status = document.getElementById("status");
  status.textContent = text;
  status.className = `pill ${kind}`;
}

function schedule() {
  clearTimeout(timer);
  timer = setTimeout(poll, POLL_MS);
}

async function poll() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  let response;
  try {
    response = await fetch(DATA_URL, { headers, cache: "no-store" });
  } catch (err) {
    setStatus("gateway unreachable", "bad");
    schedule();
    return;
  }
  if (response.status === 401) {
    askForToken(token ? "The token was refused." : "");
    return; // polling resumes once a token is given
  }
  if (!response.ok) {
    setStatus(`HTTP ${response.status}`, "bad");
    schedule();
    return;
  }
  render(await response.json());
  schedule();
}

function askForToken(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  document.getElementById("main").hidden = true;
  document.getElementById("login").hidden = false;
  document.getElementById("login-error").textContent = message;
  setStatus("admin token needed", "bad");
}

function onLogin(event) {
  event.preventDefault();
  const input = document.getElementById("token");
  sessionStorage.setItem(TOKEN_KEY, input.value.trim());
  input.value = "";
  document.getElementById("login").hidden = true;
  poll();
}

function render(doc) {
  document.getElementById("main").hidden = false;
  const gw = doc.gateway;
  if (gw.ready) setStatus("ready", "good");
  else setStatus(`not ready: ${gw.waiting_for.join(", ")}`, "bad");
  document.getElementById("updated").textContent =
    `iotgw ${gw.version} · updated ${new Date(gw.time * 1000).toLocaleTimeString()}`;
  document.getElementById("window").textContent = `(last ${gw.window_s} s)`;
  renderErrors(doc.error_replies);
  renderModels(doc.models, doc.totals);
  renderMqtt(doc.mqtt);
  renderGrpc(doc.grpc, gw.time);
  renderTuner(doc.tuner, doc.models);
}

function sparkline(values) {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("class", "spark");
  svg.setAttribute("viewBox", `0 0 ${TREND_POINTS - 1} 24`);
  svg.setAttribute("preserveAspectRatio", "none");
  const top = Math.max(...values, 1e-9);
  const points = values.map((v, i) => `${i + TREND_POINTS - values.length},${23 - (22 * v) / top}`);
  const line = document.createElementNS(ns, "polyline");
  line.setAttribute("points", points.join(" "));
  svg.append(line);
  return svg;
}

function recentBatchRows(key, batches) {
  // Rows per batch since the previous poll, from the cumulative counts the gateway reports.
  const before = lastBatches.get(key);
  lastBatches.set(key, { count: batches.count, rows: batches.rows });
  if (!before || batches.count <= before.count) return null;
  return (batches.rows - before.rows) / (batches.count - before.count);
}

function modelRow(m) {
  const key = `${m.name}/${m.version}`;
  const row = el("tr", { "data-model": m.name, "data-version": m.version });
  const stateClass = m.state === "READY" ? "good" : "bad";
  row.append(el("td", {}, m.name), el("td", {}, m.version));
  row.append(el("td", { class: stateClass, "data-field": "state", title: m.reason || "" }, m.state));
  if (!m.stats) {
    row.append(el("td", { colspan: 10, class: "muted" }, m.reason || ""));
    return row;
  }
  const s = m.stats;
  // Latencies of no request are no latencies: an idle model shows a dash, not 0.00.
  const answered = s.completed > 0;
  const perBatch = recentBatchRows(key, m.batches);
  const overall = m.batches.count ? m.batches.rows / m.batches.count : null;
  row.append(
    el("td", { class: "num", "data-field": "rate" }, fmt(s.rate_per_s, 1)),
    el("td", { "data-field": "trend" }, sparkline(m.history_per_s || [])),
    el("td", { class: "num", "data-field": "p50" }, answered ? fmt(s.p50_ms, 2) : DASH),
    el("td", { class: "num", "data-field": "p95" }, answered ? fmt(s.p95_ms, 2) : DASH),
    el("td", { class: "num", "data-field": "p99" }, answered ? fmt(s.p99_ms, 2) : DASH),
    el("td", { class: "num" }, fmt(m.slo_ms, 0)),
    el("td", { class: "num", "data-field": "queue" }, s.queue_depth),
    el("td", { class: "num", "data-field": "rows-per-request" }, answered ? fmt(s.rows_per_request, 1) : DASH),
    el(
      "td",
      { class: "num", "data-field": "batch-rows", title: `${m.batches.count} batches, ${fmt(overall)} rows each since start` },
      fmt(perBatch ?? overall, 1),
    ),
    el("td", { class: "knobs", "data-field": "knobs" }, knobText(m.knobs)),
  );
  return row;
}

function renderModels(models, totals) {
  // The gateway lists the busiest first; models with traffic or trouble are shown, the idle
  // ones folded behind one row.
  const shown = document.getElementById("busy-models");
  const idle = document.getElementById("idle-models");
  const toggle = document.getElementById("idle-toggle");
  shown.replaceChildren();
  idle.replaceChildren();
  toggle.replaceChildren();
  for (const m of models) {
    (m.state === "READY" && !busy(m.stats) ? idle : shown).append(modelRow(m));
  }
  idle.hidden = !showIdle;
  if (idle.children.length) {
    const button = el(
      "button",
      { type: "button", "data-field": "idle-toggle" },
      `${idle.children.length} idle model${idle.children.length === 1 ? "" : "s"} (${showIdle ? "hide" : "show"})`,
    );
    button.addEventListener("click", () => {
      showIdle = !showIdle;
      idle.hidden = !showIdle;
      button.textContent = button.textContent.replace(/\((show|hide)\)$/, showIdle ? "(hide)" : "(show)");
    });
    toggle.append(el("tr", {}, el("td", { colspan: 13, class: "muted" }, button)));
  }
  renderTotals(models, totals);
}

function renderTotals(models, totals) {
  const foot = document.getElementById("totals");
  foot.replaceChildren();
  if (!totals) return;
  const trend = new Array(TREND_POINTS).fill(0);
  for (const m of models) {
    (m.history_per_s || []).forEach((n, i) => { trend[i + TREND_POINTS - m.history_per_s.length] += n; });
  }
  foot.append(
    el(
      "tr",
      { "data-model": "*totals*" },
      el("th", {}, "all models"),
      el("td", {}),
      el("td", { "data-field": "serving" }, `${totals.serving} of ${totals.models} serving, ${totals.busy} busy`),
      el("td", { class: "num", "data-field": "rate" }, fmt(totals.rate_per_s, 1)),
      el("td", {}, sparkline(trend)),
      el("td", { colspan: 4, class: "muted" }, `${totals.slo_violations} over their SLO, ${totals.rejected} refused`),
      el("td", { class: "num", "data-field": "queue" }, totals.queue_depth),
      el("td", { colspan: 3 }),
    ),
  );
}

function definitionList(pairs) {
  const dl = el("dl");
  for (const [term, value, attrs] of pairs) dl.append(el("dt", {}, term), el("dd", attrs || {}, value));
  return dl;
}

function renderMqtt(mqtt) {
  const box = document.getElementById("mqtt");
  box.replaceChildren();
  if (!mqtt) {
    box.append(el("p", { class: "muted", "data-field": "mqtt-state" }, "MQTT is off on this gateway."));
    return;
  }
  const brokers = mqtt.brokers.map((b) => `${b.broker} (${b.connected ? "connected" : "disconnected"})`);
  const rejections = Object.entries(mqtt.rejections).map(([reason, n]) => `${reason}: ${n}`);
  box.append(
    definitionList([
      ["state", mqtt.connected ? "connected" : "disconnected", { class: mqtt.connected ? "good" : "bad", "data-field": "mqtt-state" }],
      ["broker", brokers.join(", ")],
      ["in flight", mqtt.in_flight, { "data-field": "mqtt-in-flight" }],
      ["backlog", mqtt.backlog],
      ["reconnects", mqtt.reconnects],
      ["duplicates", mqtt.duplicates],
      ["rejections", rejections.length ? rejections.join(", ") : "none"],
    ]),
  );
}

function recentGrpcRate(requests, time) {
  // Requests/s since the previous poll, from the cumulative count the gateway reports.
  const before = lastGrpc;
  lastGrpc = { requests, time };
  if (!before || time <= before.time || requests < before.requests) return null;
  return (requests - before.requests) / (time - before.time);
}

function renderGrpc(grpc, time) {
  const box = document.getElementById("grpc");
  box.replaceChildren();
  if (!grpc) {
    lastGrpc = null;
    box.append(el("p", { class: "muted", "data-field": "grpc-state" }, "gRPC is off on this gateway."));
    return;
  }
  const rate = recentGrpcRate(grpc.requests, time);
  const rejections = Object.entries(grpc.rejections).map(([reason, n]) => `${reason}: ${n}`);
  box.append(
    definitionList([
      ["state", grpc.listening ? "listening" : "stopped", { class: grpc.listening ? "good" : "bad", "data-field": "grpc-state" }],
      ["address", `${grpc.address} (${grpc.tls ? "TLS" : "plaintext"})`, { "data-field": "grpc-address" }],
      ["requests/s", fmt(rate, 1), { "data-field": "grpc-rate" }],
      ["requests", grpc.requests ? `${grpc.requests} (${grpc.ok} ok)` : DASH, { "data-field": "grpc-requests" }],
      ["in flight", grpc.in_flight, { "data-field": "grpc-in-flight" }],
      ["streams", grpc.streams, { "data-field": "grpc-streams" }],
      ["rejections", rejections.length ? rejections.join(", ") : "none", { "data-field": "grpc-rejections" }],
    ]),
  );
}

function renderTuner(tuner, models) {
  const box = document.getElementById("tuner");
  box.replaceChildren();
  if (!tuner.enabled) {
    box.append(el("p", { class: "muted", "data-field": "tuner-state" }, "The online tuner is off on this gateway."));
    return;
  }
  box.append(el("p", { "data-field": "tuner-state" }, `${tuner.algorithm}, ${tuner.objective} objective`));
  const withTraffic = new Set(models.filter((m) => busy(m.stats)).map((m) => m.name));
  // Busy models' agents first, open; an idle model's agent is one folded line.
  const names = Object.keys(tuner.models).sort((a, b) => withTraffic.has(b) - withTraffic.has(a));
  for (const name of names) box.append(tunerBlock(name, tuner.models[name], withTraffic.has(name)));
}

function tunerBlock(name, t, active) {
  const section = el("details", { "data-tuned-model": name });
  section.open = tunerOpen.has(name) ? tunerOpen.get(name) : active;
  const summary = el(
    "summary",
    {},
    el("strong", {}, `${name}${t.paused ? " (paused)" : ""}`),
    ` ${active ? "busy" : "idle"} · ${t.workload ? t.workload.state : DASH} · running `,
    el("span", { class: "knobs" }, knobText(t.current)),
    ` · ${t.decisions.length} recent decision${t.decisions.length === 1 ? "" : "s"}`,
  );
  // The operator's choice outlives the re-render of every poll (a click comes before the
  // toggle it causes, so it records the state the block is about to take).
  summary.addEventListener("click", () => tunerOpen.set(name, !section.open));
  section.append(summary);
  section.append(
    definitionList([
      ["workload", t.workload ? t.workload.state : DASH],
      ["running", knobText(t.current), { class: "knobs" }],
      ["best known", `${knobText(t.best)} (estimate ${fmt(t.best_estimate, 2)})`, { class: "knobs" }],
    ]),
  );
  const table = el("table", { class: "decisions" });
  table.append(
    el("thead", {}, el("tr", {}, ...["time", "kind", "configuration", "predicted", "measured", "p95 ms", "reason"].map((h) => el("th", {}, h)))),
  );
  const body = el("tbody");
  for (const d of t.decisions) {
    body.append(
      el(
        "tr",
        { "data-decision": d.kind },
        el("td", {}, new Date(d.at * 1000).toLocaleTimeString()),
        el("td", {}, d.kind),
        el("td", { class: "knobs" }, knobText(d.config)),
        el("td", { class: "num", "data-field": "predicted", title: "the tuner's estimate of this configuration's objective (– when not among its 50 best)" }, fmt(d.predicted, 2)),
        el("td", { class: "num", "data-field": "measured" }, fmt(d.objective, 2)),
        el("td", { class: "num" }, fmt(d.measurement ? d.measurement.p95_ms : null, 2)),
        el("td", { class: "muted" }, d.reason),
      ),
    );
  }
  table.append(body);
  section.append(table);
  return section;
}

function renderErrors(errors) {
  const body = document.querySelector("#errors tbody");
  body.replaceChildren();
  const rows = Object.entries(errors).flatMap(([transport, reasons]) =>
    Object.entries(reasons).map(([reason, count]) => [transport, reason, count]),
  );
  rows.sort((a, b) => b[2] - a[2]); // the most frequent first
  for (const [transport, reason, count] of rows) {
    body.append(
      el("tr", { "data-error": `${transport}/${reason}` }, el("td", {}, transport), el("td", {}, reason), el("td", { class: "num" }, count)),
    );
  }
  if (!body.children.length) body.append(el("tr", {}, el("td", { colspan: 3, class: "muted", "data-field": "no-errors" }, "none")));
}

document.getElementById("login").addEventListener("submit", onLogin);
poll();
