// mstail dashboard: charts per metric (grouped), history from /api/series, live points from /api/stream (SSE).
// Everything that comes from log text is set with textContent or drawn by ECharts on canvas: never HTML.
// Modules: util.js (helpers), state.js (state + URL), chart.js (one chart), this file (page, stream, panels).

import { GROUPS, RESERVED, fmt, fmtAxis, fmtDuration, getJSON, median, num } from "./util.js";
import { colorOf, readURL, state, themeColors, view, writeURL } from "./state.js";
import { ChartView } from "./chart.js";

const RECONNECT_MAX_MS = 10000;
const ZOOM_DEBOUNCE_MS = 100;
const RENDER_MIN_INTERVAL_MS = 200;
const STEP_TIMES_KEPT = 50;       // the header's step time is the median of this many latest steps
const HEATMAP_COLUMNS = 120;
const HEATMAP_REFRESH_MS = 5000;

const page = { pending: 0, loads: 0, firstPaint: false, applyingZoom: false, zoomTimer: null, heatmap: null,
  heatmapAt: -Infinity, lastRender: 0, renderQueued: false, detailItem: null, sourcesFetch: null };

// ---- charts -------------------------------------------------------------------------------------------
const hooks = {
  place(box, group) { groupGrid(group).append(box); document.getElementById("empty").hidden = true; },
  zoomed: (view_) => onZoom(view_),
  legend(name, selected) { setHidden(name, !selected); },
  eventClicked: (item) => showDetail(item),
  toggleLog(metric) {
    if (view.log.has(metric)) view.log.delete(metric); else view.log.add(metric);
    writeURL();
    const chart = state.charts.get(metric);
    if (chart) { chart.dirty = true; scheduleRender(); }
  },
  alertMarks,
};

function groupGrid(group) {
  let section = document.querySelector(`section.group[data-group="${group}"]`);
  if (!section) {
    section = document.createElement("section");
    section.className = "group";
    section.dataset.group = group;
    const title = document.createElement("h2");
    title.textContent = (GROUPS.find((g) => g[0] === group) || [group, group])[1];
    const grid = document.createElement("div");
    grid.className = "grid";
    section.append(title, grid);
    const order = GROUPS.map((g) => g[0]);
    const main = document.getElementById("charts");
    const before = [...main.children].find((el) => order.indexOf(el.dataset.group) > order.indexOf(group));
    main.insertBefore(section, before || null);
  }
  return section.querySelector(".grid");
}

function chartFor(metric) {
  let chart = state.charts.get(metric);
  if (!chart) {
    chart = new ChartView(metric, hooks);
    state.charts.set(metric, chart);
    echarts.connect("mstail");
  }
  return chart;
}

async function tracked(promise) {
  page.pending += 1;
  document.body.dataset.busy = "1";
  try {
    return await promise;
  } finally {
    page.pending -= 1;
    page.loads += 1;
    document.body.dataset.loads = String(page.loads);
    if (!page.pending) document.body.dataset.busy = "0";
  }
}

function noteFirstTimes() {
  for (const chart of state.charts.values()) {
    for (const line of chart.lines.values()) {
      const t = line.t.find((v) => v !== null);
      if (t === undefined) continue;
      const known = state.firstTime.get(line.source);
      if (known === undefined || t < known) state.firstTime.set(line.source, t);
    }
  }
}

// Every chart shares one x extent, so a zoom in percent (what echarts.connect passes on) is the same range on all.
function updateExtent() {
  let lo = Infinity;
  let hi = -Infinity;
  for (const chart of state.charts.values()) {
    const r = chart.xRange();
    if (r) { lo = Math.min(lo, r[0]); hi = Math.max(hi, r[1]); }
  }
  if (view.x === "step" && lo <= hi) {
    // A bucket sits at its last step: start the axis at the first step logged, so step 1 is on it too.
    for (const info of state.sources.values()) {
      if (!view.hidden.has(info.id) && typeof info.first_step === "number" && info.first_step < lo) lo = info.first_step;
    }
  }
  const extent = lo <= hi ? (lo === hi ? [lo - 1, hi + 1] : [lo, hi]) : null;
  const old = state.extent;
  if (String(old) === String(extent)) return false;
  state.extent = extent;
  for (const chart of state.charts.values()) chart.dirty = true;
  return true;
}

function scheduleRender() {
  if (page.renderQueued) return;
  page.renderQueued = true;
  const wait = Math.max(0, RENDER_MIN_INTERVAL_MS - (performance.now() - page.lastRender));
  setTimeout(() => requestAnimationFrame(renderNow), wait);
}

function renderNow() {
  page.renderQueued = false;
  page.lastRender = performance.now();
  const moved = updateExtent();
  for (const chart of state.charts.values()) if (chart.dirty) chart.render();
  if (moved && view.zoom) applyZoom();
  renderSources();
  if (performance.now() - page.heatmapAt > HEATMAP_REFRESH_MS) refreshHeatmap();
}

function renderAllNow() {
  for (const chart of state.charts.values()) chart.dirty = true;
  renderNow();
}

// ---- zoom: linked across charts, re-fetched from the server -----------------------------------------------
function onZoom(chart) {
  if (page.applyingZoom || !state.extent) return;
  const zoom = chart.chart.getOption().dataZoom[0];
  const [lo, hi] = state.extent;
  if (zoom.start <= 0 && zoom.end >= 100) view.zoom = null;
  else view.zoom = [lo + (hi - lo) * zoom.start / 100, lo + (hi - lo) * zoom.end / 100];
  writeURL();
  clearTimeout(page.zoomTimer);
  page.zoomTimer = setTimeout(() => refetchVisible(), ZOOM_DEBOUNCE_MS);
}

function applyZoom() {
  // One chart is enough: echarts.connect passes the zoom on to the others (dispatching on each would make
  // every chart redraw once per chart).
  const first = state.charts.values().next().value;
  if (!first) return;
  page.applyingZoom = true;
  try {
    if (view.zoom) first.chart.dispatchAction({ type: "dataZoom", startValue: view.zoom[0], endValue: view.zoom[1] });
    else first.chart.dispatchAction({ type: "dataZoom", start: 0, end: 100 });
  } finally {
    page.applyingZoom = false;
  }
}

async function refetchVisible() {
  const began = performance.now();
  // Each chart is redrawn as soon as its own answer is in: drawing one overlaps the others' requests.
  const jobs = [...state.charts.values()].map((chart) => {
    const range = view.zoom ? chart.stepsOf(view.zoom) : null;
    if (view.zoom && !range) return Promise.resolve();
    return tracked(chart.fetch(range)).then(() => { if (state.extent) chart.render(); })
      .catch((err) => console.warn("zoom refetch failed", err));
  });
  await Promise.all(jobs);
  const fetched = performance.now();
  renderNow();
  refreshHeatmap();
  document.body.dataset.zoomFetchMs = String(Math.round(fetched - began));
  document.body.dataset.zoomMs = String(Math.round(performance.now() - began));
}

async function zoomTo(from, to) {
  // For tests and benches: what a wheel or slider zoom does, without the debounce; resolves when drawn.
  // Returns the phases in ms: the zoom itself (charts redrawn at once with the data they hold), the
  // re-fetch of every chart's visible range, and the redraw with it.
  // Two animation frames: ECharts paints in the first, so after the second the paint is done.
  const frame = () => new Promise((resolve) => requestAnimationFrame(() => requestAnimationFrame(() => resolve())));
  const began = performance.now();
  view.zoom = from === null ? null : [from, to];
  writeURL();
  applyZoom();
  await frame();  // ECharts paints in the next animation frame: the zoomed view (held data) is on screen after it
  const zoomed = performance.now();
  await refetchVisible();
  await frame();
  const fetchMs = Number(document.body.dataset.zoomFetchMs);
  const end = performance.now();
  return { zoom: zoomed - began, fetch: fetchMs, redraw: end - zoomed - fetchMs, total: end - began };
}

async function reloadAll() {
  await Promise.all([...state.charts.values()].map(async (chart) => {
    try {
      await tracked(chart.fetch(null));
      if (view.zoom) {
        const range = chart.stepsOf(view.zoom);
        if (range) await tracked(chart.fetch(range));
      }
    } catch (err) {
      console.warn("reload failed", err);
    }
  }));
  noteFirstTimes();
  renderAllNow();
  if (view.zoom) applyZoom();
  refreshHeatmap();
}

// ---- ranks: show / hide ---------------------------------------------------------------------------------
function setHidden(source, hidden) {
  if (hidden) view.hidden.add(source); else view.hidden.delete(source);
  writeURL();
  for (const chart of state.charts.values()) chart.dirty = true;
  scheduleRender();
  if (page.heatmapAnswer) drawHeatmap(page.heatmapAnswer);
}

// ---- header strip: one card per source ------------------------------------------------------------------
function latestOf(metric, source) {
  const chart = state.charts.get(metric);
  return chart ? chart.latest.get(source) : undefined;
}

function fact(parent, label, value, cls) {
  const item = document.createElement("span");
  item.className = `fact ${cls || ""}`.trim();
  const l = document.createElement("span");
  l.className = "label";
  l.textContent = label;
  const v = document.createElement("span");
  v.className = "value";
  v.textContent = value;
  item.append(l, v);
  parent.append(item);
  return item;
}

function renderSources() {
  const strip = document.getElementById("sources");
  strip.replaceChildren();
  const now = Date.now() / 1000;
  for (const info of [...state.sources.values()].sort((a, b) => a.id.localeCompare(b.id))) {
    const card = document.createElement("div");
    card.className = "source";
    card.dataset.source = info.id;
    card.classList.toggle("hidden-source", view.hidden.has(info.id));
    const head = document.createElement("button");
    head.type = "button";
    head.className = "toggle";
    head.title = `${info.path}\nclick: show or hide this source on every chart`;
    head.setAttribute("aria-pressed", String(!view.hidden.has(info.id)));
    head.addEventListener("click", () => setHidden(info.id, !view.hidden.has(info.id)));
    const swatch = document.createElement("span");
    swatch.className = "swatch";
    swatch.style.background = colorOf(info.id);
    const id = document.createElement("span");
    id.className = "id";
    id.textContent = info.id;
    head.append(swatch, id);
    const st = document.createElement("span");
    st.className = `state ${info.state}`;
    st.textContent = (state.ended.has(info.id) ? "finished" : info.state) + (info.format ? ` · ${info.format}` : "");
    card.append(head, st);

    const facts = document.createElement("div");
    facts.className = "facts";
    const recent = state.recentStepMs.get(info.id) || [];
    const stepMs = median(recent);
    const total = info.total_steps ? ` / ${info.total_steps}` : "";
    fact(facts, "step", info.last_step === null ? "–" : `${info.last_step}${total}`, "step");
    fact(facts, "loss", fmt(latestOf("loss", info.id)), "loss");
    fact(facts, "lr", fmt(latestOf("lr", info.id)), "lr");
    fact(facts, "step time", stepMs === null ? "–" : `${fmt(Math.round(stepMs))} ms`, "steptime");
    const left = info.total_steps && info.last_step !== null ? info.total_steps - info.last_step : null;
    const eta = state.ended.has(info.id) ? "done" : left !== null && stepMs !== null ? fmtDuration(left * stepMs / 1000) : "–";
    fact(facts, "ETA", eta, "eta");
    const tflops = latestOf("throughput_tflops", info.id);
    const sps = latestOf("samples_per_s", info.id);
    fact(facts, "throughput", tflops !== undefined ? `${fmt(tflops)} TFLOPS` : sps !== undefined ? `${fmt(sps)} samples/s` : "–", "throughput");
    const since = typeof info.last_time === "number" ? Math.max(0, now - info.last_time) : null;
    const hangS = Math.max(60, 10 * (stepMs || 0) / 1000);
    const level = state.ended.has(info.id) || since === null ? "none" : since >= hangS ? "red" : since >= Math.max(15, hangS / 3) ? "amber" : "ok";
    const sinceEl = fact(facts, "since last step", since === null ? "–" : fmtDuration(since), `since ${level}`);
    sinceEl.dataset.level = level;
    card.append(facts);

    const c = info.counters || {};
    const counters = document.createElement("div");
    counters.className = "counters";
    const parts = [["lines", c.lines], ["bytes", c.bytes], ["records", info.records], ["unmatched", c.unmatched_metric_lines],
      ["field errors", c.field_errors], ["cut", c.cut_lines], ["bad utf-8", c.bad_utf8_lines],
      ["truncations", c.truncations], ["rotations", c.rotations]];
    counters.textContent = parts.filter((p) => p[1] !== undefined).map(([k, v]) => `${k} ${k === "bytes" ? fmtAxis(v) : v}`).join(" · ");
    card.append(counters);
    strip.append(card);
  }
  document.getElementById("summary").textContent =
    `${state.sources.size} source${state.sources.size === 1 ? "" : "s"} · seq ${state.lastSeq}`;
  renderBaselineChoices();
}

function noteRecord(record) {
  const info = state.sources.get(record.source);
  if (!info) { refreshSources(); return; }
  if (info.first_step === null) info.first_step = record.step;
  info.last_step = record.step;
  info.records += 1;
  if (typeof record.time === "number") info.last_time = record.time;
  if (!state.firstTime.has(record.source) && typeof record.time === "number") state.firstTime.set(record.source, record.time);
  const ms = num(record.step_time_ms);
  if (ms !== null && Number.isFinite(ms)) {
    const recent = state.recentStepMs.get(record.source) || [];
    recent.push(ms);
    if (recent.length > STEP_TIMES_KEPT) recent.shift();
    state.recentStepMs.set(record.source, recent);
  }
}

function refreshSources() {
  if (page.sourcesFetch) return;
  page.sourcesFetch = getJSON("/api/sources").then((list) => {
    for (const info of list) if (!state.sources.has(info.id)) state.sources.set(info.id, info);
    scheduleRender();
  }).catch((err) => console.warn("sources unavailable", err)).finally(() => { page.sourcesFetch = null; });
}

async function loadRecentStepTimes(sources) {
  const lasts = sources.map((s) => s.last_step).filter((s) => s !== null);
  if (!lasts.length || !sources.some((s) => s.metrics.includes("step_time_ms"))) return;
  const start = Math.min(...lasts) - STEP_TIMES_KEPT * 4;
  const answer = await getJSON(`/api/series?metric=step_time_ms&start=${start}&points=20000`);
  for (const s of answer.series) {
    const values = s.last.map(num).filter((v) => v !== null && Number.isFinite(v));
    const recent = (state.recentStepMs.get(s.source) || []).concat(values).slice(-STEP_TIMES_KEPT);
    state.recentStepMs.set(s.source, recent);
  }
}

// ---- detail panel (event text, tracebacks) -----------------------------------------------------------------
function showDetail(item) {
  page.detailItem = item;
  const panel = document.getElementById("detail");
  const when = typeof item.time === "number" ? ` · ${new Date(item.time * 1000).toLocaleString()}` : "";
  const step = typeof item.step === "number" ? ` · step ${item.step}` : "";
  document.getElementById("detail-title").textContent = `${item.kind} · ${item.source}${step}${when}`;
  const extra = Object.entries(item).filter(([k]) => !["seq", "source", "kind", "time", "step", "message", "segment"].includes(k))
    .map(([k, v]) => `${k}: ${typeof v === "object" ? JSON.stringify(v) : String(v)}`);
  document.getElementById("detail-text").textContent = [String(item.message || ""), ...extra].filter(Boolean).join("\n");
  panel.hidden = false;
  panel.dataset.kind = item.kind;
}

// ---- per-rank step-time heatmap ------------------------------------------------------------------------
async function refreshHeatmap() {
  page.heatmapAt = performance.now();
  const section = document.getElementById("heatmap");
  const withTimes = [...state.sources.values()].filter((s) => s.metrics.includes("step_time_ms"));
  if (withTimes.length < 2) { section.hidden = true; return; }
  section.hidden = false;
  if (!page.heatmap) page.heatmap = echarts.init(document.getElementById("heatmap-plot"), null, { renderer: "canvas" });
  const params = new URLSearchParams({ metric: "step_time_ms", points: String(HEATMAP_COLUMNS), smooth: "0.9" });
  const loss = state.charts.get("step_time_ms") || state.charts.get("loss");
  const range = view.zoom && loss ? loss.stepsOf(view.zoom) : null;
  if (range) { params.set("start", String(range[0])); params.set("end", String(range[1])); }
  let answer;
  try {
    answer = await tracked(getJSON(`/api/series?${params}`));
  } catch (err) {
    console.warn("heatmap unavailable", err);
    return;
  }
  page.heatmapAnswer = answer;
  drawHeatmap(answer);
}

function drawHeatmap(answer) {
  const series = answer.series.filter((s) => !view.hidden.has(s.source));
  const sources = [...new Set(series.map((s) => s.source))].sort((a, b) => b.localeCompare(a));
  let lo = Infinity;
  let hi = -Infinity;
  for (const s of series) if (s.x.length) { lo = Math.min(lo, s.x[0]); hi = Math.max(hi, s.x[s.x.length - 1]); }
  const section = document.getElementById("heatmap");
  section.dataset.rows = String(sources.length);
  if (!(lo <= hi)) return;
  const cols = Math.max(1, Math.min(HEATMAP_COLUMNS, hi - lo + 1));
  const width = (hi - lo + 1) / cols;
  const grid = sources.map(() => new Array(cols).fill(null));
  for (const s of series) {
    const row = sources.indexOf(s.source);
    for (let i = 0; i < s.x.length; i++) {
      const v = s.smooth ? s.smooth[i] : num(s.last[i]);
      if (v === null || !Number.isFinite(v)) continue;
      const col = Math.min(cols - 1, Math.floor((s.x[i] - lo) / width));
      grid[row][col] = v;
    }
  }
  const data = [];
  for (let col = 0; col < cols; col++) {
    const m = median(grid.map((r) => r[col]).filter((v) => v !== null));
    for (let row = 0; row < sources.length; row++) {
      const v = grid[row][col];
      if (v !== null && m) data.push([col, row, Number((v / m).toFixed(3)), v]);
    }
  }
  const labels = Array.from({ length: cols }, (_, i) => String(Math.round(lo + (i + 1) * width - 1)));
  const c = themeColors();
  page.heatmap.setOption({
    animation: false,
    backgroundColor: "transparent",
    grid: { left: 90, right: 70, top: 8, bottom: 28 },
    tooltip: { renderMode: "richText", backgroundColor: c.tooltip, textStyle: { color: c.text },
      formatter: (p) => `${sources[p.value[1]]} · steps to ${labels[p.value[0]]}\n${fmt(Number(p.value[3].toFixed(1)))} ms (${p.value[2]}× the ranks' median)` },
    xAxis: { type: "category", data: labels, axisLabel: { color: c.muted }, axisLine: { lineStyle: { color: c.axis } } },
    yAxis: { type: "category", data: sources, axisLabel: { color: c.text, width: 80, overflow: "truncate" }, axisLine: { lineStyle: { color: c.axis } } },
    visualMap: { min: 0.9, max: 1.3, calculable: false, orient: "vertical", right: 4, top: 8, itemHeight: 100, itemWidth: 10,
      dimension: 2, text: ["slow", "fast"], textStyle: { color: c.muted }, inRange: { color: ["#2ea121", "#c9e265", "#f5c400", "#ff8800", "#d83931"] } },
    series: [{ type: "heatmap", data, progressive: 0, emphasis: { disabled: true } }],
  }, { notMerge: true });
  section.dataset.cells = String(data.length);
}

// ---- alerts: badge, panel, chart markers, desktop notifications ---------------------------------------------
function alertMarks() {
  // One red line per alert step on the loss chart (both firing and resolved alerts: where things went wrong).
  const seen = new Set();
  const marks = [];
  for (const alert of state.alerts.values()) {
    if (typeof alert.step !== "number" || seen.has(alert.step)) continue;
    seen.add(alert.step);
    marks.push({ source: alert.source, step: alert.step, text: `${alert.rule} @ ${alert.step}` });
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
}

// ---- toolbar ---------------------------------------------------------------------------------------------
function applyTheme() {
  document.documentElement.dataset.theme = view.theme;
  document.getElementById("theme").textContent = view.theme === "dark" ? "light" : "dark";
}

function renderBaselineChoices() {
  const select = document.getElementById("baseline");
  const ids = [...state.sources.keys()].sort();
  const have = [...select.options].map((o) => o.value).slice(1);
  if (String(have) === String(ids)) { select.value = view.baseline; return; }
  const none = document.createElement("option");
  none.value = "";
  none.textContent = "off";
  select.replaceChildren(none, ...ids.map((id) => {
    const option = document.createElement("option");
    option.value = id;
    option.textContent = id;
    return option;
  }));
  select.value = ids.includes(view.baseline) ? view.baseline : "";
}

function setupToolbar() {
  const slider = document.getElementById("smooth");
  const label = document.getElementById("smooth-value");
  slider.value = String(view.smooth);
  label.textContent = view.smooth.toFixed(2);
  let timer = null;
  slider.addEventListener("input", () => {
    view.smooth = Number(slider.value);
    label.textContent = view.smooth.toFixed(2);
    clearTimeout(timer);
    timer = setTimeout(() => { writeURL(); reloadAll(); }, 200);
  });
  const xSelect = document.getElementById("xaxis");
  xSelect.value = view.x;
  xSelect.addEventListener("change", () => {
    const wasSamples = view.x === "samples";
    view.x = xSelect.value;
    view.zoom = null;
    writeURL();
    if (view.x === "samples" || wasSamples) reloadAll();
    else { state.extent = null; renderAllNow(); applyZoom(); }
  });
  const ranks = document.getElementById("ranks");
  ranks.value = view.ranks;
  ranks.addEventListener("change", () => { view.ranks = ranks.value; writeURL(); renderAllNow(); });
  const baseline = document.getElementById("baseline");
  baseline.addEventListener("change", () => { view.baseline = baseline.value; writeURL(); renderAllNow(); });
  document.getElementById("theme").addEventListener("click", () => {
    view.theme = view.theme === "dark" ? "light" : "dark";
    applyTheme();
    writeURL();
    renderAllNow();
    refreshHeatmap();
  });
  document.getElementById("reset-zoom").addEventListener("click", () => zoomTo(null, null));
  document.getElementById("detail-close").addEventListener("click", () => { document.getElementById("detail").hidden = true; });
}

// ---- live stream -----------------------------------------------------------------------------------------
function setConnection(text, cls) {
  const el = document.getElementById("connection");
  el.textContent = text;
  el.className = `conn ${cls}`;
}

function noteEvent(event) {
  if (event.kind === "alert") return;
  state.events.push(event);
  if (event.kind === "end") state.ended.add(event.source);
  if (event.kind === "start" || event.kind === "resume") state.ended.delete(event.source);
}

function connect() {
  if (state.stream) state.stream.close();
  const stream = new EventSource(`/api/stream?after=${state.lastSeq}`);
  state.stream = stream;
  stream.onopen = () => { setConnection("live", "conn-live"); state.retryMs = 500; };
  stream.addEventListener("records", (e) => {
    for (const record of JSON.parse(e.data)) {
      for (const key of Object.keys(record)) {
        if (RESERVED.has(key) || num(record[key]) === null) continue;
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
    noteEvent(event);
    for (const chart of state.charts.values()) chart.dirty = true;
    scheduleRender();
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
    const known = state.sources.get(info.id);
    state.sources.set(info.id, known && known.records > info.records ? { ...info, records: known.records,
      last_step: known.last_step, last_time: known.last_time } : info);
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

// ---- boot ------------------------------------------------------------------------------------------------
async function boot() {
  readURL();
  applyTheme();
  setupToolbar();
  setupAlerts();
  const events = getJSON("/api/events");
  const sources = await getJSON("/api/sources");
  for (const info of sources) state.sources.set(info.id, info);
  const metrics = [...new Set(sources.flatMap((s) => s.metrics))];
  // Ask for every chart's data first (all charts of the grid have the first one's width), then build the
  // charts while the answers are on their way.
  const charts = metrics.length ? [chartFor(metrics[0])] : [];
  const pending = metrics.map((m) => getJSON(charts[0].url.call({ metric: m }, null, charts[0].points())));
  charts.push(...metrics.slice(1).map((m) => chartFor(m)));
  const answers = await Promise.all(charts.map((chart, i) => tracked(chart.fetch(null, pending[i]))));
  for (const event of await events) noteEvent(event);
  noteFirstTimes();
  renderAllNow();
  await new Promise((resolve) => requestAnimationFrame(() => resolve()));
  performance.mark("mstail-first-paint");
  document.body.dataset.firstPaint = "1";
  // Stream from the oldest snapshot; each chart skips the records it already has (its own seq).
  state.lastSeq = answers.length ? Math.min(...answers.map((r) => r.seq)) : 0;
  if (view.zoom) {
    applyZoom();
    await refetchVisible();
  }
  connect();
  await Promise.all([loadAlerts(), loadRecentStepTimes(sources).catch((err) => console.warn("step times unavailable", err))]);
  renderAllNow();
  await refreshHeatmap();
  window.addEventListener("resize", () => {
    state.charts.forEach((v) => v.chart.resize());
    if (page.heatmap) page.heatmap.resize();
  });
  setInterval(renderSources, 1000);
}

// For tests and benchmarks (read-only use): the state and a way to zoom without synthesising wheel events.
window.mstail = {
  state, view, zoomTo, reloadAll,
  chartData(metric) {
    const chart = state.charts.get(metric);
    if (!chart) return null;
    return chart.sortedLines().map((l) => ({ source: l.source, segment: l.segment, x: l.x, last: l.last, min: l.min, max: l.max, smooth: l.smooth }));
  },
  option(metric) {
    const chart = state.charts.get(metric);
    if (!chart) return null;
    const option = JSON.parse(JSON.stringify(chart.chart.getOption(), (k, v) => (typeof v === "function" ? undefined : v)));
    option.series = option.series.filter(Boolean);  // replaceMerge leaves holes where series were removed
    return option;
  },
  yLabels: (metric) => state.charts.get(metric).yLabels(),
  pixel(metric, step) {
    const chart = state.charts.get(metric);
    const [x, y] = chart.chart.convertToPixel({ xAxisIndex: 0, yAxisIndex: 1 }, [chart.dispOfStep(chart.sortedLines()[0].source, step, null), 0.035]);
    const box = chart.chart.getDom().getBoundingClientRect();
    return [box.left + x, box.top + y];
  },
};

boot().catch((err) => {
  setConnection("offline", "conn-offline");
  console.error(err);
  setTimeout(() => window.location.reload(), 3000);
});
