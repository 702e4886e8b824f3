// mstail dashboard: charts per metric (grouped), history from /api/series, live points from /api/stream (SSE).
// Everything that comes from log text is set with textContent or drawn by ECharts on canvas: never HTML.
// Modules: util.js (helpers), state.js (state + URL), chart.js (one chart), stream.js (live stream),
// sources.js (header strip), alerts.js (alerts), heatmap.js (step-time heatmap), this file (boot, toolbar,
// chart grid, render loop, zoom, detail panel).

import { GROUPS, getJSON } from "./util.js";
import { readURL, state, tracked, view, writeURL } from "./state.js";
import { ChartView } from "./chart.js";
import { connect, noteEvent, setConnection, setupStream } from "./stream.js";
import { loadRecentStepTimes, renderSources, setHidden, setupSources } from "./sources.js";
import { alertMarks, loadAlerts, setupAlerts } from "./alerts.js";
import { HEATMAP_REFRESH_MS, refreshHeatmap } from "./heatmap.js";

const ZOOM_DEBOUNCE_MS = 100;
const RENDER_MIN_INTERVAL_MS = 200;

const page = { applyingZoom: false, zoomTimer: null, lastRender: 0, renderQueued: false, detailItem: null };

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
  if (performance.now() - state.heatmapAt > HEATMAP_REFRESH_MS) refreshHeatmap();
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

// ---- toolbar ---------------------------------------------------------------------------------------------
function applyTheme() {
  document.documentElement.dataset.theme = view.theme;
  document.getElementById("theme").textContent = view.theme === "dark" ? "light" : "dark";
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

// ---- boot ------------------------------------------------------------------------------------------------
async function boot() {
  setupSources({ scheduleRender });
  setupStream({ chartFor, scheduleRender });
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
    if (state.heatmap) state.heatmap.resize();
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
