// The page's state, shared by its modules. What a link must reproduce (view settings) lives in `view` and is
// mirrored into the URL's fragment (#s=0.6&x=step...), so copying the address bar reproduces the view.
// Requests in flight are counted here too (tracked), mirrored into <body data-busy data-loads> for the tests.

import { colorAt, nameMatcher } from "./util.js";

export const view = {
  smooth: 0.6,          // EMA weight (0 = off), computed by the server on the full-resolution series
  flip: new Set(),      // metrics whose smoothing default (util.js smoothByDefault) is flipped by the user
  x: "step",            // step | time | relative | samples
  ranks: "auto",        // auto (overlay up to MANY_LINES sources, else mean) | overlay | mean
  pick: new Set(),      // sources drawn on top of the mean + band (besides the worst few)
  expanded: new Set(),  // compared runs whose ranks are drawn with their mean (a click on its legend entry)
  filter: "",           // charts whose metric name matches this regex (case-insensitive)
  combine: false,       // the filter's matches drawn in one chart too (MetricsChart), above the others
  collapsed: new Set(), // chart groups folded away
  sourceFilter: "",     // the source table's name filter (a regex): the charts draw the matching sources only
  sourceSort: "name",   // name | lag | steptime | loss
  details: false,       // file-reading counters shown (a disclosure)
  baseline: "",         // a source id: charts show each other source minus this one, step-aligned
  theme: "light",       // light | dark
  tipSort: "nearest",   // the tooltip's rows: nearest (to the mouse) | ascending | descending (by value)
  hidden: new Set(),    // source ids toggled off
  log: new Set(),       // metrics drawn on a log y axis
  fit: new Set(),       // metrics whose y axis ignores outliers (the drawn raw values' 5th-95th percentile)
  zoom: null,           // [from, to] in x-axis units, or null (everything)
  pinned: new Set(),    // metrics whose charts are shown first (the "pinned" group), in the order pinned
  enlarged: "",         // the metric whose chart fills the window (Esc: back), or ""
};

export const state = {
  charts: new Map(),    // metric -> ChartView
  sources: new Map(),   // id -> /api/sources entry (kept up to date by the stream)
  runs: new Set(),      // the runs of sources found below a folder (`mstail DIR`): several are compared by default
  waitingForRuns: [],   // folders no run has been found below yet (/healthz), said while nothing is shown
  colors: new Map(),
  events: [],           // /api/events + stream `event`s (not alerts)
  alerts: new Map(),    // alert id -> alert
  recentStepMs: new Map(), // source -> last step times (ms), for the header's median and ETA
  firstTime: new Map(), // source -> time of its first record (relative time axis)
  ended: new Set(),     // sources that logged "training over" (an `end` event)
  lifecycle: new Map(), // source -> its newest start / resume / end / error event (ended? crashed?)
  worst: new Set(),     // the few sources the source table ranks worst (drawn on top of the mean + band)
  extent: null,         // [min, max] of x over every chart (all charts share it: linked zoom by percent)
  lastSeq: 0,
  stream: null,
  streamOpened: false,  // the stream has been open once (a later open is a reconnect)
  retryMs: 500,
  pending: 0,           // requests in flight (tracked): <body data-busy>
  loads: 0,             // requests done (tracked): <body data-loads>
  heatmap: null,        // the step-time heatmap's ECharts instance (heatmap.js)
  heatmapAt: -Infinity, // performance.now() of its last refresh
  heatmapAnswer: null,  // its last /api/series answer, redrawn when a source is shown or hidden
  heatmapAsked: {},     // what that answer was asked for: {range (zoom and x axis), seq (the newest then), at}
  plotSize: null,       // {width, height} of a chart's plot (all alike), measured once and on resize
};

export async function tracked(promise) {
  state.pending += 1;
  document.body.dataset.busy = "1";
  try {
    return await promise;
  } finally {
    state.pending -= 1;
    state.loads += 1;
    document.body.dataset.loads = String(state.loads);
    if (!state.pending) document.body.dataset.busy = "0";
  }
}

// Several runs are compared: one colour per run (its ranks share it), each run's lines drawn (overlay, not one mean).
export function comparingRuns() {
  return state.runs.size > 1;
}

export function colorOf(source) {
  // First come, first served (boot hands the sources over in natural order): a colour never changes while open,
  // except that a second run turning up colours every source by its run from then on.
  const run = comparingRuns() ? (state.sources.get(source) || {}).run : null;
  const key = run ? `run ${run}` : source;
  if (!state.colors.has(key)) state.colors.set(key, colorAt(state.colors.size));
  return state.colors.get(key);
}

export const CARDS_MAX = 8;       // more sources than this: a compact table (with its filter) instead of cards

// The source filter's test, compiled once per text (asked per line at every redraw).
let sourceTest = { text: null, test: () => true };
export function sourceMatcher() {
  if (sourceTest.text !== view.sourceFilter) sourceTest = { text: view.sourceFilter, ...nameMatcher(view.sourceFilter) };
  return sourceTest;
}

// A source the source filter leaves out (the filter is shown, and applies, with the table only).
export function filteredOut(id) {
  return state.sources.size > CARDS_MAX && !sourceMatcher().test(id);
}

// A source the charts leave out: toggled off, or filtered out.
export function offChart(id) {
  return view.hidden.has(id) || filteredOut(id);
}

// The sources left out of the charts (sent to the server as `exclude`).
export function offChartSources() {
  if (state.sources.size <= CARDS_MAX || !view.sourceFilter.trim()) return new Set(view.hidden);
  return new Set([...view.hidden, ...[...state.sources.keys()].filter(filteredOut)]);
}

export const MANY_LINES = 16;  // beyond this many shown sources, "auto" draws the mean + band, the worst on top

// How many shown (not hidden) sources log `metric`.
export function shownSourcesOf(metric) {
  let n = 0;
  for (const info of state.sources.values()) if (!offChart(info.id) && info.metrics.includes(metric)) n += 1;
  return n;
}

export function meanMode(shownSources) {
  if (view.baseline) return false;
  return view.ranks === "mean" || (view.ranks === "auto" && shownSources > MANY_LINES && !comparingRuns());
}

export function isDark() {
  return view.theme === "dark";
}

export function themeColors() {
  return isDark()
    ? { text: "#c9d1d9", muted: "#8b949e", axis: "#484f58", split: "#262c36", panel: "#161b22", tooltip: "#1f2630", mean: "#c9d1d9" }
    : { text: "#1f2329", muted: "#646a73", axis: "#bbbfc4", split: "#eff0f1", panel: "#ffffff", tooltip: "#ffffff", mean: "#3d4653" };
}

export function readURL() {
  const params = new URLSearchParams(window.location.hash.slice(1));
  const smooth = Number(params.get("s"));
  if (params.has("s") && Number.isFinite(smooth) && smooth >= 0 && smooth <= 0.99) view.smooth = smooth;
  if (["step", "time", "relative", "samples"].includes(params.get("x"))) view.x = params.get("x");
  if (["auto", "overlay", "mean"].includes(params.get("r"))) view.ranks = params.get("r");
  const set = (key) => new Set((params.get(key) || "").split(",").filter(Boolean));
  view.flip = set("f");
  view.pick = set("p");
  view.collapsed = set("c");
  if (params.has("q")) view.filter = params.get("q");
  view.combine = params.get("qm") === "1";
  if (params.has("sq")) view.sourceFilter = params.get("sq");
  if (["name", "lag", "steptime", "loss"].includes(params.get("o"))) view.sourceSort = params.get("o");
  if (params.has("b")) view.baseline = params.get("b");
  if (["nearest", "ascending", "descending"].includes(params.get("ts"))) view.tipSort = params.get("ts");
  if (["light", "dark"].includes(params.get("t"))) view.theme = params.get("t");
  else if (!params.has("t") && window.matchMedia && window.matchMedia("(prefers-color-scheme: dark)").matches) view.theme = "dark";
  view.hidden = set("h");
  view.log = set("l");
  view.fit = set("io");
  view.pinned = set("pin");
  view.expanded = set("xr");
  view.enlarged = params.get("e") || "";
  const zoom = (params.get("z") || "").split(",").map(Number);
  if (zoom.length === 2 && zoom.every(Number.isFinite) && zoom[0] < zoom[1]) view.zoom = zoom;
}

export function writeURL() {
  const params = new URLSearchParams();
  params.set("s", String(view.smooth));
  params.set("x", view.x);
  params.set("r", view.ranks);
  if (view.baseline) params.set("b", view.baseline);
  params.set("t", view.theme);
  if (view.tipSort !== "nearest") params.set("ts", view.tipSort);
  if (view.hidden.size) params.set("h", [...view.hidden].join(","));
  if (view.log.size) params.set("l", [...view.log].join(","));
  if (view.fit.size) params.set("io", [...view.fit].join(","));
  if (view.pinned.size) params.set("pin", [...view.pinned].join(","));
  if (view.expanded.size) params.set("xr", [...view.expanded].join(","));
  if (view.enlarged) params.set("e", view.enlarged);
  for (const [key, values] of [["f", view.flip], ["p", view.pick], ["c", view.collapsed]]) {
    if (values.size) params.set(key, [...values].join(","));
  }
  if (view.filter) params.set("q", view.filter);
  if (view.combine) params.set("qm", "1");
  if (view.sourceFilter) params.set("sq", view.sourceFilter);
  if (view.sourceSort !== "name") params.set("o", view.sourceSort);
  if (view.zoom) params.set("z", view.zoom.map((v) => String(Number(v.toPrecision(12)))).join(","));
  // The query string (e.g. ?token=...) stays as it is; the view lives in the fragment, never sent to the server.
  history.replaceState(null, "", `${window.location.pathname}${window.location.search}#${params}`);
}
