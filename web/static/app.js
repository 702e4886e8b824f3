// mstail dashboard: charts per metric (grouped), history from /api/series, live points from /api/stream (SSE).
// Everything that comes from log text is set with textContent or drawn by ECharts on canvas: never HTML.
// Modules: util.js (helpers), state.js (state + URL), chart.js (one chart), stream.js (live stream),
// sources.js (header strip), alerts.js (alerts), heatmap.js (step-time heatmap), this file (boot, toolbar,
// chart grid, render loop, zoom, detail panel).

import { GROUPS, RESERVED, getJSON, nameMatcher, natural } from "./util.js";
import { CARDS_MAX, offChart, readURL, state, tracked, view, writeURL } from "./state.js";
import { ChartView, EVENT_KINDS, EVENT_STYLE, MATCHING, MAX_MARKERS, MetricsChart, legendGlyph, readTime } from "./chart.js";
import { connect, noteEvent, setConnection, setupStream } from "./stream.js";
import { fetchSources, loadRecentStepTimes, noteSource, renderSources, setHidden, setupSources } from "./sources.js";
import { alertMarks, loadAlerts, setupAlerts } from "./alerts.js";
import { HEATMAP_REFRESH_MS, refreshHeatmap } from "./heatmap.js";

const ZOOM_DEBOUNCE_MS = 100;
const RENDER_MIN_INTERVAL_MS = 200;
// A streamed redraw waits at least this many times as long as the last one took: when records pour in (a history
// being caught up) and drawing is slow (a busy CPU, many charts), drawing takes at most a fifth of the main thread
// and of a CPU mstail needs, instead of all of it.
const RENDER_BUSY_FACTOR = 4;
const HEALTH_CHECK_MS = 5000;  // how often the page asks /healthz whether mstail itself is in trouble
const HEALTH_RECHECK_MS = 1000;  // ... and while it shows a problem: the banner goes within a second of its end
const SOURCES_REFRESH_MS = 1000;  // the sources' facts (step, lag, since last step) are at most this much behind

const page = { boxes: 0, sourcesAt: -Infinity, booting: true, applyingZoom: false, zoomTimer: null, lastRender: 0, renderMs: 0, renderQueued: false, detailItem: null };

// ---- charts ---------------------------------------------------------------------------------------------
// A chart is a box at once (cheap: a title and an empty plot of fixed height) and becomes an ECharts instance with
// its data when it first comes near the screen (IntersectionObserver); only charts near the screen are drawn. So
// 1,000 metrics cost 1,000 boxes, and a handful of fetches and draws.
const NEAR_SCREEN = "600px 0px";       // how far beyond the viewport a chart counts as near
// fetched at once wherever they are: the source cards show their latest values; overflow marks every chart.
// With many sources (the table: loss only) each fetch is large, so only what is on the first screen is fetched.
const EAGER_METRICS = ["loss", "lr", "throughput_tflops", "samples_per_s", "overflow"];
const eager = (metric) => (state.sources.size > CARDS_MAX ? metric === "loss" : EAGER_METRICS.includes(metric));

const hooks = {
  place(box, group) { placeBox(box, group); applyFilter(box); observer().observe(box); },
  zoomed: (view_) => onZoom(view_),
  legend(name, selected) { if (state.sources.has(name)) setHidden(name, !selected); },
  eventClicked: (item) => showDetail(item),
  toggleLog(metric) { toggleIn(view.log, metric, false); },
  toggleFit(metric) { toggleIn(view.fit, metric, false); },
  toggleSmooth(metric) { toggleIn(view.flip, metric, true); },
  togglePin: (metric) => togglePin(metric),
  expandRun(run) {
    if (view.expanded.has(run)) view.expanded.delete(run); else view.expanded.add(run);
    writeURL();
    for (const chart of state.charts.values()) chart.dirty = true;  // each asks again (render: wantedFor)
    scheduleRender();
  },
  enlarge: (metric) => enlarge(metric),
  ready: (chart) => activate(chart, true),
  refetch(chart) { chart.stale = true; if (chart.visible) activate(chart, false); },
  alertMarks,
};

function toggleIn(set, metric, refetch) {
  if (set.has(metric)) set.delete(metric); else set.add(metric);
  writeURL();
  const chart = state.charts.get(metric);
  if (!chart) return;
  if (refetch) { chart.stale = true; if (chart.visible) activate(chart, true); return; }
  chart.dirty = true;
  scheduleRender();
}

// ---- pin and enlarge ----------------------------------------------------------------------------------
const PINNED = "pinned";  // the group of pinned charts: first, above every other (not in GROUPS' order)

// A chart box into its group's grid (or the pinned one), before the boxes made after it: unpinned, it is back
// where it was.
function placeBox(box, group) {
  if (!box.dataset.order) box.dataset.order = String(page.boxes++);
  const pinned = view.pinned.has(box.dataset.metric);
  const grid = groupGrid(pinned ? PINNED : group);
  const order = Number(box.dataset.order);
  const after = pinned ? null : [...grid.children].find((b) => Number(b.dataset.order) > order);
  grid.insertBefore(box, after || null);
}

function togglePin(metric) {
  if (view.pinned.has(metric)) view.pinned.delete(metric); else view.pinned.add(metric);
  writeURL();
  const chart = state.charts.get(metric);
  if (!chart) return;
  placeBox(chart.el, chart.group);
  chart.setTool(chart.pinButton, view.pinned.has(metric));
  filterCharts();
}

// One chart fills the window ("" : none); Esc or its button again brings it back into the grid.
function enlarge(metric) {
  const old = state.charts.get(view.enlarged);
  view.enlarged = state.charts.has(metric) ? metric : "";
  writeURL();
  if (old && old.el.classList.contains("enlarged")) {
    old.el.classList.remove("enlarged");
    old.setTool(old.enlargeButton, false);
    if (old.chart) old.chart.resize(old.plotSize());
    old.dirty = true;
  }
  document.body.classList.toggle("enlarging", !!view.enlarged);
  const chart = state.charts.get(view.enlarged);
  if (chart) {
    chart.el.classList.add("enlarged");
    chart.setTool(chart.enlargeButton, true);
    chart.visible = true;
    if (chart.chart) chart.chart.resize(chart.plotSize());
    chart.stale = true;  // asked again: more points for the wider plot
    activate(chart, true).then(() => { if (chart.chart) chart.chart.resize(chart.plotSize()); });
  }
  scheduleRender();
}

let intersections = null;
function observer() {
  if (!intersections) {
    intersections = new IntersectionObserver((entries) => {
      for (const entry of entries) {
        const chart = state.charts.get(entry.target.dataset.metric);
        if (!chart) continue;
        chart.visible = entry.isIntersecting;
        if (chart.visible && !page.booting) activate(chart, false);  // boot draws the first screen itself
      }
    }, { rootMargin: NEAR_SCREEN });
  }
  return intersections;
}

// Make a chart's ECharts instance, fetch what it lacks and draw it. `draw`: draw even if off screen (export).
async function activate(chart, draw) {
  if (!chart.chart) chart.init();
  if (!chart.loaded || chart.stale) {
    await load(chart).catch((err) => console.warn("chart fetch failed", err));
    noteFirstTimes();
    if (updateExtent()) scheduleRender();
  }
  if (draw) chart.render();
  else { chart.dirty = true; scheduleRender(); }  // drawn with the others in the next render pass
}

// One fetch of a chart's history at a time (the observer, boot and the slider may all ask); resolves to the answer.
function load(chart) {
  if (!chart.refreshing) {
    chart.refreshing = tracked(chart.refresh(stepsOf)).finally(() => { chart.refreshing = null; });
  }
  return chart.refreshing;
}

const stepsOf = (chart) => chart.stepsOf(view.zoom);

const grids = new Map();  // group -> its grid (1,000 boxes: one look-up each)

function groupGrid(group) {
  if (grids.has(group)) return grids.get(group);
  let section = document.querySelector(`section.group[data-group="${group}"]`);
  if (!section) {
    section = document.createElement("section");
    section.className = "group";
    section.dataset.group = group;
    const title = document.createElement("h2");
    const fold = document.createElement("button");
    fold.type = "button";
    fold.className = "fold";
    fold.title = "fold or unfold this group";
    const name = document.createElement("span");
    name.textContent = group === PINNED ? "Pinned" : group === MATCHING ? "Matching metrics" : (GROUPS.find((g) => g[0] === group) || [group, group])[1];
    const count = document.createElement("span");
    count.className = "count muted";
    fold.append(name, count);
    fold.addEventListener("click", () => {
      if (view.collapsed.has(group)) view.collapsed.delete(group); else view.collapsed.add(group);
      writeURL();
      applyCollapsed(section);
    });
    title.append(fold);
    const grid = document.createElement("div");
    grid.className = "grid";
    section.append(title, grid);
    const order = GROUPS.map((g) => g[0]);
    const main = document.getElementById("charts");
    const before = [...main.children].find((el) => order.indexOf(el.dataset.group) > order.indexOf(group));
    main.insertBefore(section, before || null);
    applyCollapsed(section);
  }
  grids.set(group, section.querySelector(".grid"));
  return grids.get(group);
}

function applyCollapsed(section) {
  const folded = view.collapsed.has(section.dataset.group);
  section.classList.toggle("collapsed", folded);
  section.querySelector(".fold").setAttribute("aria-expanded", String(!folded));
  section.querySelector(".grid").hidden = folded;
}

// The chart filter, a regular expression (case-insensitive) as in TensorBoard: charts whose name it does not match
// are hidden (and so neither fetched nor drawn). An invalid one is said next to the box and read as plain text.
let filterTest = { text: null, test: () => true };

function chartFilter() {
  const text = view.filter.trim();
  if (filterTest.text === text) return filterTest.test;
  const { test, problem } = nameMatcher(text);
  const box = document.getElementById("metric-filter");
  box.classList.toggle("invalid", !!problem);
  box.title = problem || "show only the charts whose name matches this regular expression";
  const error = document.getElementById("metric-filter-error");
  error.textContent = problem ? "invalid regex" : "";
  error.title = problem;
  error.hidden = !problem;
  filterTest = { text, test };
  return test;
}

function applyFilter(box) {
  box.hidden = !chartFilter()(box.dataset.metric);
}

function filterCharts() {
  for (const chart of state.charts.values()) applyFilter(chart.el);
  updateCombined();
  for (const section of document.querySelectorAll("section.group")) {
    const boxes = [...section.querySelectorAll("section.chart")];
    const shown = boxes.filter((b) => !b.hidden).length;
    section.hidden = shown === 0;
    section.querySelector(".fold .count").textContent = shown === boxes.length ? ` ${boxes.length}` : ` ${shown} of ${boxes.length}`;
  }
}

// The toolbar's "one chart": the filter's matches (two or more) drawn together above their own charts. Their own
// charts fetch the data (those not fetched yet are now) and take the live records; it draws what they hold.
function updateCombined() {
  document.getElementById("combine-label").hidden = !view.filter.trim();  // (it draws the filter's matches)
  const members = view.combine && view.filter.trim() ? [...state.charts.values()].filter((c) => !c.el.hidden) : [];
  if (members.length < 2) {
    if (page.combined) {
      if (page.combined.chart) page.combined.chart.dispose();
      page.combined.el.remove();
      page.combined = null;
    }
    return;
  }
  if (!page.combined) {
    page.combined = new MetricsChart({ ...hooks, place(box) { groupGrid(MATCHING).append(box); } });
  }
  if (String(page.combined.members.map((c) => c.metric)) === String(members.map((c) => c.metric))) return;
  page.combined.setMembers(members);
  const combined = page.combined;
  for (const chart of members) {
    if (chart.loaded) continue;
    load(chart).then(() => { noteFirstTimes(); updateExtent(); combined.dirty = true; scheduleRender(); })
      .catch((err) => console.warn("chart fetch failed", err));
  }
  scheduleRender();
}

function renderCombined() {
  const combined = page.combined;
  if (!combined || typeof echarts === "undefined") return;
  if (!combined.chart) combined.init();
  combined.render();
}

function chartFor(metric) {
  let chart = state.charts.get(metric);
  if (!chart) {
    chart = new ChartView(metric, hooks);
    state.charts.set(metric, chart);
    document.getElementById("empty").hidden = true;
    if (!page.countsQueued) {  // the groups' counts, once per batch of new charts
      page.countsQueued = true;
      queueMicrotask(() => { page.countsQueued = false; filterCharts(); });
    }
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
      if (!offChart(info.id) && typeof info.first_step === "number" && info.first_step < lo) lo = info.first_step;
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
  const interval = Math.max(RENDER_MIN_INTERVAL_MS, RENDER_BUSY_FACTOR * page.renderMs);
  const wait = Math.max(0, interval - (performance.now() - page.lastRender));
  setTimeout(() => requestAnimationFrame(() => {
    renderNow();
    page.renderMs = performance.now() - page.lastRender;
  }), wait);
}

function renderNow() {
  page.renderQueued = false;
  page.lastRender = performance.now();
  const moved = updateExtent();
  for (const chart of state.charts.values()) {
    if (chart.dirty && chart.visible) chart.render();
    else if (chart.dirty && chart.loaded) {
      chart.noteShown();
      chart.notePoints();
    }
  }
  renderCombined();
  if (moved && view.zoom) applyZoom();
  // The sources' strip at most once a second from here (its own timer keeps it current): 1,024 ranks' table is
  // tens of ms to rebuild, which a zoom's redraw and every live batch would otherwise pay.
  if (performance.now() - page.sourcesAt >= SOURCES_REFRESH_MS) renderSourcesNow();
  if (performance.now() - state.heatmapAt > HEATMAP_REFRESH_MS) refreshHeatmap(true);
}

function renderSourcesNow() {
  page.sourcesAt = performance.now();
  renderSources();
}

function renderAllNow() {
  for (const chart of state.charts.values()) chart.dirty = true;
  renderNow();
}

const drawnCharts = () => [...state.charts.values()].filter((c) => c.chart);

// ---- zoom: linked across charts, re-fetched from the server -----------------------------------------------
function onZoom(chart) {
  if (page.applyingZoom || !state.extent) return;
  const zoom = chart.chart.getOption().dataZoom[0];
  const [lo, hi] = state.extent;
  if (zoom.start <= 0 && zoom.end >= 100) view.zoom = null;
  else view.zoom = [lo + (hi - lo) * zoom.start / 100, lo + (hi - lo) * zoom.end / 100];
  // Steps are whole: the zoom's bounds too (the steps it holds, in the URL and the re-fetch).
  if (view.zoom && view.x === "step") view.zoom = [Math.floor(view.zoom[0]), Math.ceil(view.zoom[1])];
  writeURL();
  clearTimeout(page.zoomTimer);
  page.zoomTimer = setTimeout(() => refetchVisible(), ZOOM_DEBOUNCE_MS);
}

function applyZoom() {
  // One chart is enough: echarts.connect passes the zoom on to the others (dispatching on each would make
  // every chart redraw once per chart).
  const first = drawnCharts()[0];
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
  // The charts on screen first, each redrawn as soon as its own answer is in (drawing one overlaps the others'
  // requests); those near the screen after them, the others when they come near it. The zoom's time is the
  // first screen's.
  const onScreenNow = [];
  const nearScreen = [];
  for (const chart of state.charts.values()) {
    if (!chart.loaded) continue;
    if (!chart.visible) { chart.stale = true; continue; }
    (onScreen(chart) ? onScreenNow : nearScreen).push(chart);
  }
  const redraw = (charts) => Promise.all(charts.map((chart) => {
    const range = view.zoom ? chart.stepsOf(view.zoom) : null;
    if (view.zoom && !range) return null;
    return tracked(chart.fetch(range)).then(() => { if (state.extent) chart.render(); })
      .catch((err) => console.warn("zoom refetch failed", err));
  }));
  await redraw(onScreenNow);
  const fetched = performance.now();
  document.body.dataset.zoomFetchMs = String(Math.round(fetched - began));
  document.body.dataset.zoomMs = String(Math.round(performance.now() - began));
  // The rest (the near charts, the sources' strip, the heatmap when on screen) after the first screen is drawn.
  redraw(nearScreen).then(() => { scheduleRender(); refreshHeatmap(true); });
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
  // Charts near the screen (and those the cards read) re-fetch now; the others when they come near it.
  const now = [];
  for (const chart of state.charts.values()) {
    if (!chart.loaded) continue;
    chart.stale = true;
    if (chart.visible || eager(chart.metric)) now.push(activate(chart, false));
  }
  await Promise.all(now);
  noteFirstTimes();
  renderAllNow();
  if (view.zoom) applyZoom();
  refreshHeatmap();
}

// ---- detail panel (event text, tracebacks) -----------------------------------------------------------------
// The reserved keys the panel lists below the message; the title shows the others that matter (kind, source, step,
// time), and seq and segment are the stream's bookkeeping.
const DETAIL_RESERVED = new Set(["epoch", "line", "estimated"]);

function showDetail(item) {
  page.detailItem = item;
  const panel = document.getElementById("detail");
  // The log's time of the line; a line without one has the moment mstail read it, said as such.
  const read = readTime(item) ? " (read time)" : "";
  const when = typeof item.time === "number" ? ` · ${new Date(item.time * 1000).toLocaleString()}${read}` : "";
  const step = typeof item.step === "number" ? ` · step ${item.step}` : "";
  document.getElementById("detail-title").textContent = `${item.kind} · ${item.source}${step}${when}`;
  const extra = Object.entries(item).filter(([k]) => !RESERVED.has(k) || DETAIL_RESERVED.has(k))
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
  const tipSort = document.getElementById("tooltip-sort");
  tipSort.value = view.tipSort;
  tipSort.addEventListener("change", () => { view.tipSort = tipSort.value; writeURL(); });
  const filter = document.getElementById("metric-filter");
  filter.value = view.filter;
  filter.addEventListener("input", () => { view.filter = filter.value; writeURL(); filterCharts(); });
  const combine = document.getElementById("combine");
  combine.checked = view.combine;
  combine.addEventListener("change", () => { view.combine = combine.checked; writeURL(); filterCharts(); });
  document.getElementById("reset-zoom").addEventListener("click", () => zoomTo(null, null));
  document.getElementById("shortcuts-button").addEventListener("click", () => toggleShortcuts());
  setupShortcuts();
  document.getElementById("detail-close").addEventListener("click", () => { document.getElementById("detail").hidden = true; });
}

// ---- keyboard shortcuts (listed on "?") -------------------------------------------------------------------
const SHORTCUTS = [
  ["/", "filter the charts", () => document.getElementById("metric-filter").focus()],
  ["m", "ranks: auto, overlay, mean + band in turn", () => cycleSelect("ranks")],
  ["x", "x axis: step, wall time, relative time, samples in turn", () => cycleSelect("xaxis")],
  ["o", "tooltip order: nearest, ascending, descending in turn", () => cycleSelect("tooltip-sort")],
  ["r", "reset the zoom", () => zoomTo(null, null)],
  ["t", "light or dark theme", () => document.getElementById("theme").click()],
  ["?", "show or hide this list", () => toggleShortcuts()],
  ["Esc", "close this list, the alerts, the event text and an enlarged chart", () => closePanels()],
];

function cycleSelect(id) {
  const select = document.getElementById(id);
  select.selectedIndex = (select.selectedIndex + 1) % select.options.length;
  select.dispatchEvent(new Event("change"));
}

function toggleShortcuts() {
  const panel = document.getElementById("shortcuts");
  if (!panel.children.length) {
    const title = document.createElement("h2");
    title.textContent = "Keyboard shortcuts";
    const list = document.createElement("dl");
    for (const [key, what] of SHORTCUTS) {
      const term = document.createElement("dt");
      const kbd = document.createElement("kbd");
      kbd.textContent = key;
      term.append(kbd);
      const description = document.createElement("dd");
      description.textContent = what;
      list.append(term, description);
    }
    panel.append(title, list);
  }
  panel.hidden = !panel.hidden;
}

function closePanels() {
  if (view.enlarged) enlarge("");
  for (const id of ["shortcuts", "detail"]) document.getElementById(id).hidden = true;
  if (!document.getElementById("alerts-panel").hidden) document.getElementById("alerts-badge").click();
}

function setupShortcuts() {
  document.addEventListener("keydown", (event) => {
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    const typing = event.target.closest && event.target.closest("input, select, textarea");
    if (typing) {
      if (event.key === "Escape") event.target.blur();
      return;
    }
    const key = event.key === "Escape" ? "Esc" : event.key;
    const shortcut = SHORTCUTS.find(([k]) => k === key);
    if (!shortcut) return;
    event.preventDefault();
    shortcut[2]();
  });
}

// ---- boot ------------------------------------------------------------------------------------------------
// A banner while /healthz reports problems (tailing stopped or stalled, the history not written to disk), or that
// the history's file is being checked (the check takes about a second); asked again each second while one shows.
async function checkHealth() {
  const banner = document.getElementById("health");
  let next = HEALTH_CHECK_MS;
  try {
    const response = await fetch("/healthz", { cache: "no-store" });
    const facts = await response.json();
    const problems = [...(facts.problems || []), ...(facts.state_check ? [facts.state_check] : [])];
    if (problems.length) next = HEALTH_RECHECK_MS;
    state.waitingForRuns = facts.waiting_for_runs || [];
    banner.textContent = problems.length ? `mstail: ${problems.join("; ")}` : "";
    banner.hidden = !problems.length;
  } catch (err) {
    banner.textContent = "mstail does not answer (stopped, or the network is down)";
    banner.hidden = false;
  }
  setTimeout(checkHealth, next);
}

// The markers' legend, drawn from the same glyphs as the charts: every kind, each its own shape and colour.
function renderMarkerLegend() {
  const footer = document.getElementById("legend-help");
  const parts = [document.createTextNode("Markers on the x axis (kinds at one step are stacked): ")];
  for (const kind of EVENT_KINDS) {
    const item = document.createElement("span");
    item.className = "glyph-item";
    item.dataset.kind = kind;
    item.append(legendGlyph(kind), document.createTextNode(` ${EVENT_STYLE[kind].label}`));
    parts.push(item);
  }
  parts.push(document.createTextNode(" · red dashed line: NaN/Inf · red line: an alert."));
  footer.replaceChildren(...parts);
}

function onScreen(chart) {
  const box = chart.el.getBoundingClientRect();
  return box.height > 0 && box.top < window.innerHeight && box.bottom > 0;
}

// ECharts' deferred script runs after this module and before DOMContentLoaded (this module runs while the document
// is already "interactive", so the ready state says nothing: ask for ECharts itself).
const echartsLoaded = typeof window.echarts !== "undefined" ? Promise.resolve()
  : new Promise((resolve) => document.addEventListener("DOMContentLoaded", resolve, { once: true }));

async function boot() {
  performance.mark("mstail-boot");
  readURL();  // first: the toolbar's and the sources' boxes show the URL's view
  setupSources({ scheduleRender });
  setupStream({ chartFor, scheduleRender });
  applyTheme();
  setupToolbar();
  setupAlerts();
  renderMarkerLegend();
  const events = getJSON(`/api/events?newest=true&limit=${MAX_MARKERS}`);
  const sources = await fetchSources();
  for (const info of sources.sort((a, b) => natural(a.id, b.id))) noteSource(info);
  const metrics = [...new Set(sources.flatMap((s) => s.metrics))];
  performance.mark("mstail-sources");
  for (const metric of metrics) chartFor(metric);
  performance.mark("mstail-boxes");
  renderSourcesNow();  // the strip's height decides which charts are on the first screen
  // The charts on the first screen (and those the source cards read) fetch their data now; the rest as they
  // come near the screen.
  const first = [...state.charts.values()].filter((c) => onScreen(c));
  for (const chart of first) chart.visible = true;
  const wanted = new Set([...first, ...[...state.charts.values()].filter((c) => eager(c.metric))]);
  const answers = await Promise.all([...wanted].map((chart) => load(chart)));
  performance.mark("mstail-data");
  await echartsLoaded;  // ECharts runs after this module (index.html): the data was asked for meanwhile
  echarts.connect("mstail");
  for (const chart of first) chart.init();
  for (const event of await events) noteEvent(event);
  noteFirstTimes();
  renderAllNow();
  await new Promise((resolve) => requestAnimationFrame(() => resolve()));
  performance.mark("mstail-first-paint");
  document.body.dataset.firstPaint = "1";
  page.booting = false;
  for (const chart of state.charts.values()) if (chart.visible && (!chart.chart || !chart.loaded)) activate(chart, false);
  // Stream from the oldest snapshot; each chart skips the records it already has (its own seq).
  state.lastSeq = answers.length ? Math.min(...answers.map((r) => r.seq)) : 0;
  if (view.zoom) applyZoom();
  if (view.enlarged) enlarge(view.enlarged);
  connect();
  await Promise.all([loadAlerts(), loadRecentStepTimes(sources).catch((err) => console.warn("step times unavailable", err))]);
  // The alerts' marks in the next paced redraw, with the records streamed meanwhile: a second full render here
  // took half a second of the main thread during a catch-up, right after the first.
  for (const chart of state.charts.values()) chart.dirty = true;
  scheduleRender();
  renderSourcesNow();  // the step times and alerts just came: the sources' facts (step time, ETA, state) now
  await refreshHeatmap();
  window.addEventListener("resize", () => {
    state.plotSize = null;
    const inGrid = drawnCharts().filter((v) => v.metric !== view.enlarged);
    if (inGrid.length) {
      const size = inGrid[0].plotSize();
      inGrid.forEach((v) => v.chart.resize(size));
    }
    const enlarged = state.charts.get(view.enlarged);
    if (enlarged && enlarged.chart) enlarged.chart.resize(enlarged.plotSize());
    if (state.heatmap) state.heatmap.resize();
  });
  setInterval(renderSourcesNow, SOURCES_REFRESH_MS);
  checkHealth();
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
  yExtent: (metric) => state.charts.get(metric).chart.getModel().getComponent("yAxis", 0).axis.scale.getExtent(),
  pixel(metric, step, level = 0.035) {  // where a marker at `step` (at `level` on the markers' 0..1 axis) is drawn
    const chart = state.charts.get(metric);
    const [x, y] = chart.chart.convertToPixel({ xAxisIndex: 0, yAxisIndex: 1 }, [chart.dispOfStep(chart.sortedLines()[0].source, step, null), level]);
    const box = chart.chart.getDom().getBoundingClientRect();
    return [box.left + x, box.top + y];
  },
};

boot().catch((err) => {
  setConnection("offline", "conn-offline");
  console.error(err);
  setTimeout(() => window.location.reload(), 3000);
});
