// mstail dashboard: one chart per metric, history from /api/series, live points from /api/stream (SSE).
// Everything that comes from log text is set with textContent or drawn by ECharts on canvas: never HTML.
"use strict";

const GROUP_ORDER = ["loss", "optim", "speed", "eval", "other"];
const POINTS = 2000;            // points asked per series (the server returns min/max buckets above this)
const ZOOM_DEBOUNCE_MS = 150;
const RECONNECT_MAX_MS = 10000;

const state = {
  charts: new Map(),            // metric -> ChartView
  sources: new Map(),           // id -> source info from /api/sources
  colors: new Map(),            // source id -> palette colour
  lastSeq: 0,
  alerts: new Map(),            // alert id -> latest alert (from /api/alerts, then SSE `alert` events)
  stream: null,
  retryMs: 500,
};

const PALETTE = ["#3370ff", "#f54a45", "#34c724", "#ff8800", "#7f3bf5", "#14c0ff", "#f5c400", "#a23b72",
  "#2a9d8f", "#e76f51", "#264653", "#8ab17d"];

function metricGroup(metric) {
  if (metric.startsWith("eval_")) return "eval";
  if (/loss/.test(metric)) return "loss";
  if (/^(lr|grad_norm|loss_scale|overflow)$/.test(metric)) return "optim";
  if (/(time|throughput|samples|tflops)/.test(metric)) return "speed";
  return "other";
}

function fmt(value) {
  if (value === null || value === undefined) return "–";
  if (typeof value === "string") return value;  // "NaN", "Infinity"
  if (Number.isInteger(value)) return String(value);
  const abs = Math.abs(value);
  if (abs !== 0 && (abs < 1e-3 || abs >= 1e6)) return value.toExponential(3);
  return String(Number(value.toPrecision(6)));
}

function num(value) {
  // Non-finite values travel as strings ("NaN", "Infinity", "-Infinity"); null means "no value".
  if (typeof value === "number") return value;
  if (value === "NaN") return NaN;
  if (value === "Infinity") return Infinity;
  if (value === "-Infinity") return -Infinity;
  return null;
}

async function getJSON(url) {
  const response = await fetch(url, { cache: "no-store" });
  if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
  return response.json();
}

function colorOf(source) {
  if (!state.colors.has(source)) state.colors.set(source, PALETTE[state.colors.size % PALETTE.length]);
  return state.colors.get(source);
}

// ---- one chart per metric --------------------------------------------------------------------------------
class ChartView {
  constructor(metric) {
    this.metric = metric;
    this.lines = new Map();      // "source#segment" -> {source, segment, points: [[x, y]], band: [[x, min, max]]}
    this.nonfinite = [];         // [x, "NaN" | "Infinity" ...]
    this.seq = 0;                // records up to this seq are already in the data
    this.latest = new Map();     // source -> latest value
    this.dirty = false;
    this.build();
  }

  build() {
    const box = document.createElement("section");
    box.className = "chart";
    box.dataset.metric = this.metric;
    box.dataset.group = metricGroup(this.metric);
    const title = document.createElement("h2");
    const name = document.createElement("span");
    name.className = "name";
    name.textContent = this.metric;
    this.latestEl = document.createElement("span");
    this.latestEl.className = "latest";
    title.append(name, this.latestEl);
    const plot = document.createElement("div");
    plot.className = "plot";
    box.append(title, plot);
    insertChart(box);
    this.el = box;
    this.chart = echarts.init(plot, null, { renderer: "canvas" });
    this.chart.group = "mstail";
    echarts.connect("mstail");
    this.chart.setOption({
      animation: false,
      grid: { left: 56, right: 16, top: 24, bottom: 56 },
      legend: { type: "scroll", top: 0, textStyle: { fontSize: 11 } },
      tooltip: { trigger: "axis", renderMode: "richText", confine: true },
      xAxis: { type: "value", name: "step", nameLocation: "end", min: "dataMin", max: "dataMax" },
      yAxis: { type: "value", scale: true },
      dataZoom: [{ type: "inside", filterMode: "none" }, { type: "slider", height: 18, bottom: 8, filterMode: "none" }],
      series: [],
    });
    let timer = null;
    this.chart.on("datazoom", () => {
      clearTimeout(timer);
      timer = setTimeout(() => this.refetchVisible(), ZOOM_DEBOUNCE_MS);
    });
  }

  visibleRange() {
    const option = this.chart.getOption();
    const zoom = option.dataZoom && option.dataZoom[0];
    if (!zoom || (zoom.start === 0 && zoom.end === 100)) return null;
    return [Math.floor(zoom.startValue), Math.ceil(zoom.endValue)];
  }

  load(response, range) {
    // Replace the data in `range` (or everything) with the server's answer: exact points or buckets.
    for (const s of response.series) {
      const key = `${s.source}#${s.segment}`;
      let line = this.lines.get(key);
      if (!line) {
        line = { source: s.source, segment: s.segment, points: [], band: [] };
        this.lines.set(key, line);
      }
      const fresh = s.x.map((x, i) => [x, num(s.last[i])]);
      const band = s.x.map((x, i) => [x, num(s.min[i]), num(s.max[i])]);
      const bucketed = s.x.some((_, i) => s.min[i] !== s.max[i]);
      if (range) {
        const keep = (p) => p[0] < range[0] || p[0] > range[1];
        line.points = merge(line.points.filter(keep), fresh);
        line.band = merge(line.band.filter(keep), bucketed ? band : []);
      } else {
        line.points = fresh;
        line.band = bucketed ? band : [];
      }
      if (s.last.length && !range) this.latest.set(s.source, s.last[s.last.length - 1]);
      for (let i = 0; i < s.nonfinite.x.length; i++) this.addNonfinite(s.nonfinite.x[i], s.nonfinite.value[i]);
    }
    this.seq = Math.max(this.seq, response.seq);
    this.render();
  }

  append(record) {
    if (record.seq <= this.seq) return;
    const value = record[this.metric];
    const y = num(value);
    if (y === null) return;
    const key = `${record.source}#${record.segment || 0}`;
    let line = this.lines.get(key);
    if (!line) {
      line = { source: record.source, segment: record.segment || 0, points: [], band: [] };
      this.lines.set(key, line);
    }
    line.points.push([record.step, Number.isFinite(y) ? y : null]);
    if (!Number.isFinite(y)) this.addNonfinite(record.step, value);
    this.latest.set(record.source, value);
    this.seq = record.seq;
    this.dirty = true;
  }

  addNonfinite(x, value) {
    if (!this.nonfinite.some((p) => p[0] === x)) this.nonfinite.push([x, value]);
  }

  async refetchVisible() {
    const range = this.visibleRange();
    const width = this.chart.getWidth() || 600;
    const params = new URLSearchParams({ metric: this.metric, points: String(Math.max(200, width * 2)) });
    if (range) { params.set("start", range[0]); params.set("end", range[1]); }
    try {
      this.load(await getJSON(`/api/series?${params}`), range);
    } catch (err) {
      console.warn("zoom refetch failed", err);
    }
  }

  render() {
    this.dirty = false;
    const series = [];
    const sorted = [...this.lines.values()].sort((a, b) => a.source.localeCompare(b.source) || a.segment - b.segment);
    for (const line of sorted) {
      const color = colorOf(line.source);
      series.push({
        name: line.source, type: "line", data: line.points.map((p) => [p[0], Number.isFinite(p[1]) ? p[1] : null]),
        showSymbol: line.points.length < 60, symbolSize: 4, connectNulls: false, color, lineStyle: { width: 1.5 },
        emphasis: { disabled: true },
      });
      if (line.band.length) {
        // Raw min/max of each bucket under the line, so a spike hidden by bucketing still shows.
        series.push({ name: line.source, type: "line", data: line.band.map((b) => [b[0], b[1]]), stack: `band-${line.source}-${line.segment}`,
          lineStyle: { opacity: 0 }, symbol: "none", color, tooltip: { show: false }, silent: true });
        series.push({ name: line.source, type: "line", data: line.band.map((b) => [b[0], b[2] - b[1]]), stack: `band-${line.source}-${line.segment}`,
          lineStyle: { opacity: 0 }, symbol: "none", color, areaStyle: { opacity: 0.18 }, tooltip: { show: false }, silent: true });
      }
    }
    if (this.nonfinite.length) {
      series.push({
        name: "non-finite", type: "line", data: [], color: "#d83931",
        markLine: { symbol: "none", silent: false, lineStyle: { color: "#d83931", type: "dashed", width: 1.5 },
          label: { formatter: (p) => String(p.data.value_text), color: "#d83931" },
          data: this.nonfinite.map(([x, value]) => ({ xAxis: x, value_text: `${value} @ ${x}` })) },
      });
    }
    const marks = this.metric === "loss" ? alertMarks() : [];
    if (marks.length) {
      series.push({
        name: "alerts", type: "line", data: [], color: "#d83931",
        markLine: { symbol: "none", silent: true, lineStyle: { color: "#d83931", type: "solid", width: 1, opacity: 0.7 },
          label: { formatter: (p) => String(p.data.rule_text), color: "#d83931", position: "insideEndTop", fontSize: 10 },
          data: marks },
      });
    }
    this.el.dataset.alertMarks = String(marks.length);
    this.chart.setOption({ series }, { replaceMerge: ["series"] });
    this.el.dataset.points = String(sorted.reduce((n, l) => n + l.points.length, 0));
    this.el.dataset.nonfinite = String(this.nonfinite.length);
    this.latestEl.textContent = [...this.latest.entries()].map(([source, v]) => `${source}: ${fmt(v)}`).join("  ");
  }
}

// ---- alerts: badge, panel, chart markers, desktop notifications ---------------------------------------------
function alertMarks() {
  // One red line per alert step on the loss chart (both firing and resolved alerts: where things went wrong).
  const seen = new Set();
  const marks = [];
  for (const alert of state.alerts.values()) {
    if (typeof alert.step !== "number" || seen.has(alert.step)) continue;
    seen.add(alert.step);
    marks.push({ xAxis: alert.step, rule_text: `${alert.rule} @ ${alert.step}` });
  }
  return marks;
}

function noteAlert(alert, live) {
  const known = state.alerts.get(alert.id);
  state.alerts.set(alert.id, alert);
  if (live && alert.state === "firing" && alert.notify !== false && (!known || known.state !== "firing")) notify(alert);
  const loss = state.charts.get("loss");
  if (loss) loss.dirty = true;
}

function alertText(alert) {
  const step = typeof alert.step === "number" ? ` step ${alert.step}` : "";
  return `${alert.rule} · ${alert.source}${step}`;
}

function notify(alert) {
  if (!("Notification" in window) || Notification.permission !== "granted") return;
  try {
    new Notification(`mstail: ${alertText(alert)}`, { body: String(alert.message || ""), tag: alert.id });
  } catch (err) {
    console.warn("notification failed", err);
  }
}

function renderAlerts() {
  const all = [...state.alerts.values()];
  const active = all.filter((a) => a.state === "firing");
  const badge = document.getElementById("alerts-badge");
  document.getElementById("alerts-count").textContent = String(active.length);
  badge.classList.toggle("firing", active.length > 0);
  badge.dataset.count = String(active.length);
  const list = document.getElementById("alerts-list");
  list.replaceChildren();
  all.sort((a, b) => (a.state === b.state ? b.last_seen - a.last_seen : a.state === "firing" ? -1 : 1));
  for (const alert of all) {
    const row = document.createElement("li");
    row.className = `alert ${alert.severity} ${alert.state}`;
    row.dataset.id = alert.id;
    row.dataset.rule = alert.rule;
    const sev = document.createElement("span");
    sev.className = "sev";
    sev.textContent = alert.state === "resolved" ? "resolved" : alert.severity;
    const what = document.createElement("span");
    what.className = "what";
    what.textContent = alertText(alert);
    const message = document.createElement("span");
    message.className = "message";
    message.textContent = String(alert.message || "");
    const when = document.createElement("span");
    when.className = "when";
    const count = alert.count > 1 ? ` ×${alert.count}` : "";
    when.textContent = `${new Date(alert.last_seen * 1000).toLocaleTimeString()}${count}`;
    row.append(sev, what, message, when);
    list.append(row);
  }
  document.getElementById("alerts-none").hidden = all.length > 0;
}

function setupAlerts() {
  const badge = document.getElementById("alerts-badge");
  const panel = document.getElementById("alerts-panel");
  badge.addEventListener("click", () => {
    panel.hidden = !panel.hidden;
    badge.setAttribute("aria-expanded", String(!panel.hidden));
  });
  const ask = document.getElementById("alerts-notify");
  if ("Notification" in window && Notification.permission === "default") {
    ask.hidden = false;
    ask.addEventListener("click", () => {
      Notification.requestPermission().then(() => { ask.hidden = true; });
    });
  }
}

async function loadAlerts() {
  try {
    const table = await getJSON("/api/alerts");
    for (const alert of [...table.resolved, ...table.active]) noteAlert(alert, false);
  } catch (err) {
    console.warn("alerts unavailable", err);
  }
  renderAlerts();
  scheduleRender();
}

function merge(a, b) {
  return a.concat(b).sort((p, q) => p[0] - q[0]);
}

function insertChart(box) {
  const charts = document.getElementById("charts");
  const rank = (el) => GROUP_ORDER.indexOf(el.dataset.group);
  const before = [...charts.children].find((el) => rank(el) > rank(box));
  charts.insertBefore(box, before || null);
  document.getElementById("empty").hidden = true;
}

function chartFor(metric) {
  let view = state.charts.get(metric);
  if (!view) {
    view = new ChartView(metric);
    state.charts.set(metric, view);
  }
  return view;
}

// ---- sources strip ---------------------------------------------------------------------------------------
function renderSources() {
  const strip = document.getElementById("sources");
  strip.replaceChildren();
  for (const info of state.sources.values()) {
    const box = document.createElement("div");
    box.className = "source";
    box.dataset.source = info.id;
    const swatch = document.createElement("span");
    swatch.className = "swatch";
    swatch.style.background = colorOf(info.id);
    const id = document.createElement("span");
    id.className = "id";
    id.textContent = info.id;
    id.title = info.path;
    const st = document.createElement("span");
    st.className = `state ${info.state}`;
    st.textContent = info.state;
    const facts = document.createElement("span");
    facts.className = "facts";
    const total = info.total_steps ? ` / ${info.total_steps}` : "";
    facts.textContent = info.last_step === null ? (info.format || "no records yet")
      : `step ${info.last_step}${total} · ${info.records} records · ${info.format}`;
    box.append(swatch, id, st, facts);
    strip.append(box);
  }
  document.getElementById("summary").textContent =
    `${state.sources.size} source${state.sources.size === 1 ? "" : "s"} · seq ${state.lastSeq}`;
}

function noteRecord(record) {
  const info = state.sources.get(record.source);
  if (!info) return;
  info.last_step = record.step;
  info.records += 1;
  info.last_time = record.time;
}

// ---- live stream -----------------------------------------------------------------------------------------
function setConnection(text, cls) {
  const el = document.getElementById("connection");
  el.textContent = text;
  el.className = `conn ${cls}`;
}

function connect() {
  if (state.stream) state.stream.close();
  const stream = new EventSource(`/api/stream?after=${state.lastSeq}`);
  state.stream = stream;
  stream.onopen = () => { setConnection("live", "conn-live"); state.retryMs = 500; };
  stream.addEventListener("records", (e) => {
    const records = JSON.parse(e.data);
    for (const record of records) {
      for (const key of Object.keys(record)) {
        if (RESERVED.has(key)) continue;
        if (num(record[key]) === null) continue;
        chartFor(key).append(record);
      }
      noteRecord(record);
      state.lastSeq = Math.max(state.lastSeq, record.seq);
    }
    scheduleRender();
  });
  stream.addEventListener("event", (e) => {
    const event = JSON.parse(e.data);
    state.lastSeq = Math.max(state.lastSeq, event.seq);
  });
  stream.addEventListener("alert", (e) => {
    const alert = JSON.parse(e.data);
    state.lastSeq = Math.max(state.lastSeq, alert.seq);
    noteAlert(alert, true);
    renderAlerts();
    scheduleRender();
  });
  stream.addEventListener("source", (e) => {
    const info = JSON.parse(e.data);
    state.sources.set(info.id, info);
    scheduleRender();
  });
  stream.addEventListener("reset", () => window.location.reload());
  stream.onerror = () => {
    if (stream.readyState === EventSource.CLOSED) {
      // A proxy error or a non-200 answer closes EventSource for good: reconnect ourselves, with backoff.
      setConnection("offline", "conn-offline");
      setTimeout(connect, state.retryMs);
      state.retryMs = Math.min(state.retryMs * 2, RECONNECT_MAX_MS);
    } else {
      setConnection("reconnecting", "conn-connecting");
    }
  };
}

const RESERVED = new Set(["seq", "source", "step", "epoch", "time", "segment", "line", "kind", "message"]);
let renderQueued = false;

function scheduleRender() {
  if (renderQueued) return;
  renderQueued = true;
  requestAnimationFrame(() => {
    renderQueued = false;
    for (const view of state.charts.values()) if (view.dirty) view.render();
    renderSources();
  });
}

async function boot() {
  setupAlerts();
  const sources = await getJSON("/api/sources");
  for (const info of sources) state.sources.set(info.id, info);
  const metrics = [...new Set(sources.flatMap((s) => s.metrics))];
  const responses = await Promise.all(metrics.map((m) => getJSON(`/api/series?metric=${encodeURIComponent(m)}&points=${POINTS}`)));
  responses.forEach((response, i) => chartFor(metrics[i]).load(response, null));
  // Stream from the oldest snapshot; each chart skips the records it already has (its own seq).
  state.lastSeq = responses.length ? Math.min(...responses.map((r) => r.seq)) : 0;
  renderSources();
  await loadAlerts();
  connect();
  window.addEventListener("resize", () => state.charts.forEach((v) => v.chart.resize()));
}

boot().catch((err) => {
  setConnection("offline", "conn-offline");
  console.error(err);
  setTimeout(() => window.location.reload(), 3000);
});
