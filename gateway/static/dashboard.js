// iotgw live dashboard: polls the gateway's one JSON document (admin/dashboard.json, the same one
// the tests read) and redraws. Every value reaches the page through textContent, never as HTML,
// so a model name or a reason cannot inject markup.
"use strict";

const DATA_URL = "admin/dashboard.json";
const POLL_MS = 1000;
const TREND_POINTS = 60;
const TOKEN_KEY = "iotgw.adminToken";

const rateHistory = new Map(); // "model/version" -> recent requests/s
const lastBatches = new Map(); // "model/version" -> {count, rows} at the previous poll
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
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  return Number(value).toFixed(digits);
}

function knobText(knobs) {
  if (!knobs) return "–";
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
  renderModels(doc.models);
  renderMqtt(doc.mqtt);
  renderTuner(doc.tuner);
  renderErrors(doc.error_replies);
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

function renderModels(models) {
  const body = document.querySelector("#models tbody");
  body.replaceChildren();
  for (const m of models) {
    const key = `${m.name}/${m.version}`;
    const row = el("tr", { "data-model": m.name, "data-version": m.version });
    const stateClass = m.state === "READY" ? "good" : "bad";
    row.append(el("td", {}, m.name), el("td", {}, m.version));
    row.append(el("td", { class: stateClass, "data-field": "state", title: m.reason || "" }, m.state));
    if (!m.stats) {
      row.append(el("td", { colspan: 10, class: "muted" }, m.reason || ""));
      body.append(row);
      continue;
    }
    const s = m.stats;
    const rates = rateHistory.get(key) || [];
    rates.push(s.rate_per_s);
    if (rates.length > TREND_POINTS) rates.shift();
    rateHistory.set(key, rates);
    const perBatch = recentBatchRows(key, m.batches);
    const overall = m.batches.count ? m.batches.rows / m.batches.count : null;
    row.append(
      el("td", { class: "num", "data-field": "rate" }, fmt(s.rate_per_s, 1)),
      el("td", {}, sparkline(rates)),
      el("td", { class: "num", "data-field": "p50" }, fmt(s.p50_ms, 2)),
      el("td", { class: "num", "data-field": "p95" }, fmt(s.p95_ms, 2)),
      el("td", { class: "num", "data-field": "p99" }, fmt(s.p99_ms, 2)),
      el("td", { class: "num" }, fmt(m.slo_ms, 0)),
      el("td", { class: "num", "data-field": "queue" }, s.queue_depth),
      el("td", { class: "num", "data-field": "rows-per-request" }, fmt(s.rows_per_request, 1)),
      el(
        "td",
        { class: "num", "data-field": "batch-rows", title: `${m.batches.count} batches, ${fmt(overall)} rows each since start` },
        fmt(perBatch ?? overall, 1),
      ),
      el("td", { class: "knobs", "data-field": "knobs" }, knobText(m.knobs)),
    );
    body.append(row);
  }
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

function renderTuner(tuner) {
  const box = document.getElementById("tuner");
  box.replaceChildren();
  if (!tuner.enabled) {
    box.append(el("p", { class: "muted", "data-field": "tuner-state" }, "The online tuner is off on this gateway."));
    return;
  }
  box.append(el("p", { "data-field": "tuner-state" }, `${tuner.algorithm}, ${tuner.objective} objective`));
  for (const [name, t] of Object.entries(tuner.models)) {
    const section = el("div", { "data-tuned-model": name });
    section.append(el("h3", {}, `${name}${t.paused ? " (paused)" : ""}`));
    section.append(
      definitionList([
        ["workload", t.workload ? t.workload.state : "–"],
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
    box.append(section);
  }
}

function renderErrors(errors) {
  const body = document.querySelector("#errors tbody");
  body.replaceChildren();
  for (const [transport, reasons] of Object.entries(errors)) {
    for (const [reason, count] of Object.entries(reasons)) {
      body.append(el("tr", {}, el("td", {}, transport), el("td", {}, reason), el("td", { class: "num" }, count)));
    }
  }
  if (!body.children.length) body.append(el("tr", {}, el("td", { colspan: 3, class: "muted" }, "none")));
}

document.getElementById("login").addEventListener("submit", onLogin);
poll();
