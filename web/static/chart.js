// One chart per metric. Data comes from /api/series (exact points, or min/max buckets of the visible range,
// re-fetched on zoom) and from the live stream. Drawn on canvas by ECharts: nothing from the log becomes markup.

import { bisectRight, colorAt, csvCell, download, fmt, fmtAxis, fmtDuration, fmtTick, getJSON, isoTime, metricGroup, natural, num, safeName,
  smoothByDefault } from "./util.js";
import { MANY_LINES, colorOf, comparingRuns, filteredOut, meanMode, offChart, offChartSources, shownSourcesOf, state, themeColors, view } from "./state.js";

// Event markers on the x axis: one glyph per kind, each a shape of its own (never two kinds alike), drawn from
// the same paths in the page's legend (legendGlyph). Kinds at the same place are stacked upwards in this order.
export const EVENT_STYLE = {
  start: { path: "M0,0 L10,5 L0,10 Z", color: "#00a37a", size: 9, label: "start" },
  checkpoint: { path: "M5,0 L10,5 L5,10 L0,5 Z", color: "#3370ff", size: 10, label: "checkpoint" },
  eval: { path: "M5,0 A5,5 0 1,1 4.99,0 Z", color: "#2ea121", size: 9, label: "eval" },
  overflow: { path: "M5,0 L10,10 L0,10 Z", color: "#ff8800", size: 9, label: "overflow" },
  resume: { path: "M0,0 L5,5 L0,10 Z M5,0 L10,5 L5,10 Z", color: "#7f3bf5", size: 10, label: "resume" },
  end: { path: "M0,0 L10,0 L10,10 L0,10 Z", color: "#646a73", size: 9, label: "training over" },
  error: { path: "M5,10 L1.2,5 A4.5,4.5 0 1,1 8.8,5 Z", color: "#d83931", size: 14, label: "error (click it for the text)" },
};
export const EVENT_KINDS = Object.keys(EVENT_STYLE);

// An item whose `time` is the moment mstail read its line (the log gave none there): its `estimated` names "time".
export function readTime(item) {
  return typeof item.estimated === "string" && item.estimated.split(" ").includes("time");
}
const MARKER_BASE_Y = 0.035;  // on the hidden 0..1 axis: just above the x axis
const MARKER_STEP_Y = 0.075;  // one glyph higher per kind at the same place
const MARKER_GAP_PX = 16;     // glyphs closer than this on the x axis share a stack (the widest glyph: 14 px)
const ALERT_LABEL_GAP_PX = 90;  // alert labels closer than this are merged into one ("+N")
const NAN_LABEL_GAP_PX = 4;     // at least this much room between two NaN labels (else merged: "+N")
const LEGEND_ROWS_MAX = 3;   // legend rows above a plot at most (two dozen names or so); beyond, none on the chart
const LEGEND_ROW_PX = 18;
const LEGEND_GAP_PX = 10;
let measureCtx = null;      // a canvas context that measures legend names
const MANY_SOURCES_POINTS = 60000;  // points per chart at most, shared by its sources (1,024 ranks: 58 each)

// A glyph as a small SVG (same path as on the chart), for the page's legend.
export function legendGlyph(kind) {
  const style = EVENT_STYLE[kind];
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("viewBox", "-1 -1 12 12");
  svg.setAttribute("width", "12");
  svg.setAttribute("height", "12");
  svg.setAttribute("class", "glyph");
  const path = document.createElementNS("http://www.w3.org/2000/svg", "path");
  path.setAttribute("d", style.path);
  path.setAttribute("fill", style.color);
  svg.append(path);
  return svg;
}
export const MAX_MARKERS = 3000;  // events drawn per chart (the newest ones beyond that are kept; the page loads no more)
const MAX_NAN_LINES = 300;    // non-finite markLines per chart
const NAN_COLOR = "#d83931";

function emptyLine(source, segment) {
  return { source, segment, x: [], t: [], s: [], last: [], min: [], max: [], smooth: [], ema: null, served: 0 };
}

const COLUMNS = ["x", "t", "s", "last", "min", "max", "smooth"];
const LATER_COLUMNS = ["x", "t", "s", "last", "smooth"];  // a bucket takes these of its later point (halveStreamed)
const AGGREGATE_COLUMNS = [...COLUMNS, "n"];
const MEAN = "(mean)";  // the source name of the server's mean across sources (never a source id: ids are file names)
const LIVE_CELLS_MAX = 500;  // cells of the mean the stream may add before the chart fetches the mean again
// Points the stream may add to a line after its answer's: past this many they are merged two by two
// (halveStreamed). A history the sidecar is catching up on streams tens of thousands of records a second, and a page
// left open for days gets a point per step: drawn one by one, either would grow every redraw without end.
const LIVE_POINTS_MAX = 500;

const lower = (a, b) => (a === null ? b : b === null ? a : Math.min(a, b));
const higher = (a, b) => (a === null ? b : b === null ? a : Math.max(a, b));

// The points the stream added to a line (after its answer's `served`), merged two by two into buckets as the
// server's: the later point's step, time, value and smoothed value; the lower min and the higher max (a spike stays).
function halveStreamed(line) {
  const end = line.x.length;
  let k = line.served;
  for (let i = line.served; i < end; i += 2, k++) {
    const j = Math.min(i + 1, end - 1);
    for (const c of LATER_COLUMNS) line[c][k] = line[c][j];
    line.min[k] = lower(line.min[i], line.min[j]);
    line.max[k] = higher(line.max[i], line.max[j]);
  }
  for (const c of COLUMNS) line[c].length = k;
}

// The EMA state {num, den, x} after folding value `y` at step `x` into `state` (the server's debiased, step-aware EMA).
function foldEma(ema, state, x, y) {
  const dx = state.x === null ? ema.stride : x - state.x;
  const d = dx === ema.stride || dx <= 0 ? ema.w : Math.pow(ema.w, dx / ema.stride);
  return { num: d * state.num + (1 - d) * y, den: d * state.den + (1 - d), x };
}

// A chart box before its metric is set (cloned per chart) and the one click listener for every box's buttons.
const TOOLS = [["smooth", ""], ["log", "log-scale y axis"],
  ["fit", "ignore outliers: the y axis spans the 5th to 95th percentile of the drawn raw values"],
  ["csv", "download the visible data as CSV"],
  ["png", "download this chart as PNG"],
  ["pin", "pin this chart: shown first, above every group"],
  ["enlarge", "enlarge this chart to the whole window (Esc: back)"]];
const views = new WeakMap();  // box -> its ChartView
let template = null;

function chartTemplate() {
  if (template) return template;
  template = document.createElement("section");
  template.className = "chart";
  const head = document.createElement("h3");
  const name = document.createElement("span");
  name.className = "name";
  const latest = document.createElement("span");
  latest.className = "latest";
  const tools = document.createElement("span");
  tools.className = "tools";
  for (const [label, title] of TOOLS) {
    const button = document.createElement("button");
    button.type = "button";
    button.className = `tool tool-${label}`;
    button.textContent = label;
    button.title = title;
    tools.append(button);
  }
  head.append(name, latest, tools);
  const plot = document.createElement("div");
  plot.className = "plot";
  template.append(head, plot);
  document.addEventListener("click", (event) => {
    const button = event.target.closest && event.target.closest("button.tool");
    const view_ = button && views.get(button.closest("section.chart"));
    if (view_) view_.toolClicked(button.className.match(/tool-(\w+)/)[1]);
  });
  return template;
}

export class ChartView {
  constructor(metric, hooks) {
    this.metric = metric;
    this.group = metricGroup(metric);
    this.hooks = hooks;
    this.lines = new Map();      // "source#segment" -> columns (see emptyLine)
    this.nonfinite = new Map();  // "source#step" -> {source, x, value}
    this.latest = new Map();     // source -> latest value
    this.seq = 0;
    this.dirty = false;
    this.chart = null;           // the ECharts instance: made when the chart first comes near the screen (init)
    this.visible = false;        // near the screen (app.js's IntersectionObserver): only such charts are drawn
    this.loaded = false;         // its history has been fetched (live records are kept from then on)
    this.loading = null;         // a whole answer is being fetched; records that arrive meanwhile wait in `held`
    this.held = [];
    this.stale = false;          // the zoom changed while it was off screen: re-fetch when it comes back
    // Many sources: the server's mean across them (columns as a line's plus `n`, and `live`: step -> the EMA state
    // before each cell the stream added), the sources it names as outliers, and what the answer was asked for.
    this.agg = null;
    this.runAggs = new Map();    // compared runs: run -> the server's mean of its shown ranks (as `agg`)
    this.runNames = new Map();   // a run's mean's legend name -> the run (a click on it shows or hides its ranks)
    this.outliers = new Set();
    this.fetchedFor = "";
    this.fetches = 0;            // fetches started (the newest one's answer wins)
    this.build();
  }

  build() {
    // A clone of one template, its buttons answered by one listener for every chart (toolClicked): 1,000 boxes
    // built one element and four listeners at a time took 160 ms of a visit's CPU profile.
    const box = chartTemplate().cloneNode(true);
    box.dataset.metric = this.metric;
    box.dataset.group = this.group;
    const [name, latest, tools] = box.firstChild.children;
    name.textContent = this.metric;
    this.latestEl = latest;
    [this.smoothButton, this.logButton, this.fitButton] = tools.children;
    this.pinButton = tools.querySelector(".tool-pin");
    this.enlargeButton = tools.querySelector(".tool-enlarge");
    this.smoothButton.title = smoothByDefault(this.metric)
      ? "smoothing on for this chart (the slider's weight): click to draw it as logged"
      : "a schedule, flag or counter: drawn as logged; click to smooth it too";
    this.el = box;
    this.plot = box.lastChild;
    views.set(box, this);
    this.hooks.place(box, this.group);
    if (view.pinned.has(this.metric)) this.setTool(this.pinButton, true);
  }

  toolClicked(label) {
    if (label === "smooth") this.hooks.toggleSmooth(this.metric);
    else if (label === "log") this.hooks.toggleLog(this.metric);
    else if (label === "fit") this.hooks.toggleFit(this.metric);
    else if (label === "csv") this.exportCSV();
    else if (label === "png") this.exportPNG();
    else if (label === "pin") this.hooks.togglePin(this.metric);
    else if (label === "enlarge") this.hooks.enlarge(view.enlarged === this.metric ? "" : this.metric);
  }

  // A tool button's state (pin, enlarge: set by app.js when they change, not at each redraw).
  setTool(button, on) {
    button.classList.toggle("on", on);
    button.setAttribute("aria-pressed", String(on));
  }

  // Every plot of the grid has the same size: measured once (app.js, state.plotSize) rather than per chart, as each
  // reading of a size after a change to the page lays out every chart box again (1,000 of them: seconds).
  plotSize() {
    if (this.el.classList.contains("enlarged")) return ownSize(this.plot);
    // measured on a plot that is laid out (not one hidden by the filter): else a guess, not kept
    if (!state.plotSize && this.plot.clientWidth) state.plotSize = ownSize(this.plot);
    return state.plotSize || ownSize(this.plot);
  }

  init() {
    if (this.chart) return;
    const { width, height } = this.plotSize();
    this.chart = echarts.init(this.plot, null, { renderer: "canvas", width, height });
    this.chart.group = "mstail";
    this.chart.setOption(this.baseOption());
    this.fresh = true;  // its first render takes the current zoom (the others got it through echarts.connect)
    this.chart.on("datazoom", () => this.hooks.zoomed(this));
    // Where the mouse is on the y axis: the tooltip's "nearest" order ranks the lines by their distance to it.
    // Only the chart under the mouse shows its tooltip (the linked charts show their crosshair only).
    // Noted in the capture phase: before ECharts' own handlers ask for the tooltip.
    this.plot.addEventListener("mousemove", (e) => { this.mouseY = e.clientY; this.hovered = true; }, true);
    this.plot.addEventListener("mouseleave", () => { this.hovered = false; });
    this.chart.on("legendselectchanged", (e) => {
      if (this.runNames.has(e.name)) this.hooks.expandRun(this.runNames.get(e.name));
      else this.hooks.legend(e.name, e.selected[e.name]);
    });
    this.chart.on("click", (p) => {
      if (p.seriesId === "events" && p.data) this.hooks.eventClicked(p.data.item);
    });
  }

  baseOption() {
    return {
      animation: false,
      backgroundColor: "transparent",
      grid: { left: 56, right: 18, top: 32, bottom: 50 },
      // Plain (no pages): as many rows as its names need, up to LEGEND_ROWS_MAX (legendRows); beyond, the source
      // table or cards are the legend.
      legend: { type: "plain", top: 2, left: 0, right: 0, padding: [2, 5], itemGap: LEGEND_GAP_PX, itemWidth: 14,
        itemHeight: 8, textStyle: { fontSize: 11, lineHeight: 14 } },
      // HTML outside the chart (on the page's body), placed inside the window by tipPosition; built from DOM
      // nodes with textContent (never markup from the log).
      tooltip: { trigger: "axis", renderMode: "html", appendTo: "body", className: "mstail-tip", transitionDuration: 0,
        formatter: (p) => (this.hovered ? this.tooltip(p) : ""),
        position: (point, _p, dom, _r, size) => this.tipPosition(point, dom, size.contentSize) },
      xAxis: { type: "value" },
      yAxis: [{ type: "value", scale: true }, { type: "value", min: 0, max: 1, show: false }],
      dataZoom: [
        { type: "inside", xAxisIndex: 0, filterMode: "none" },
        // No data shadow in the slider: it is drawn from the full series on every redraw (60 % of a chart's
        // draw time); the slider is a range handle, the chart above shows the data.
        { type: "slider", xAxisIndex: 0, filterMode: "none", height: 16, bottom: 6, showDetail: false, showDataShadow: false },
      ],
      series: [],
    };
  }

  // ---- data ------------------------------------------------------------------------------------------
  params(range, points) {
    const params = new URLSearchParams({ metric: this.metric, points: String(points) });
    if (range) { params.set("start", String(range[0])); params.set("end", String(range[1])); }
    if (this.smoothing()) params.set("smooth", String(view.smooth));
    if (view.x === "samples") params.set("axis", "samples");
    return params;
  }

  url(range, points) {
    const params = this.params(range, points);
    if (this.aggregated()) {
      // One answer: the mean across the shown sources, and the few drawn on top of it (the outliers come with it).
      params.set("aggregate", "mean");
      const off = offChartSources();
      const shown = [...state.sources.keys()].filter((s) => !off.has(s));
      if (off.size <= shown.length) for (const s of off) params.append("exclude", s);
      else for (const s of shown) params.append("source", s);
      for (const s of this.pinned()) params.append("top", s);
    }
    this.fetchedFor = this.wantedFor();
    return `/api/series?${params}`;
  }

  // Many sources shown as the mean + band: the server sends their mean, not one series per source (a few sources
  // shown as the mean are averaged here, from their own lines). Not on the consumed-samples axis (a per-source
  // quantity) and not in the difference view.
  aggregated() {
    const shown = shownSourcesOf(this.metric);
    return view.x !== "samples" && shown > MANY_LINES && meanMode(shown);
  }

  pinned() {
    return [...new Set([...view.pick, ...state.worst])].filter((s) => !offChart(s)).sort(natural);
  }

  // Runs compared (ranks "auto", several runs, one of them with several shown ranks): each such run is the server's
  // mean of its shown ranks with their band, one answer per run (its starred ranks, or all of them when the run is
  // expanded, come with it); the runs of one rank are their lines. Not on the consumed-samples axis (see aggregated).
  runsMode() {
    if (view.ranks !== "auto" || view.baseline || view.x === "samples" || !comparingRuns()) return false;
    return this.runGroups().some((g) => g.ids.length > 1);
  }

  // The shown sources logging this metric, by run.
  runGroups() {
    const runs = new Map();
    for (const info of state.sources.values()) {
      if (offChart(info.id) || !info.metrics.includes(this.metric)) continue;
      const run = info.run || "";
      if (!runs.has(run)) runs.set(run, []);
      runs.get(run).push(info.id);
    }
    return [...runs].map(([run, ids]) => ({ run, ids: ids.sort(natural) }));
  }

  // One answer made of the runs' answers (their means in `runs`, their ranks' and the lone runs' lines in `series`).
  async fetchRuns(range) {
    const groups = this.runGroups();
    const width = this.points();
    const asks = [];
    const lone = groups.filter((g) => g.ids.length < 2).flatMap((g) => g.ids);
    for (const { run, ids } of groups) {
      if (ids.length < 2) continue;
      const params = this.params(range, width);
      params.set("aggregate", "mean");
      for (const id of ids) params.append("source", id);
      for (const id of view.expanded.has(run) ? ids : ids.filter((i) => view.pick.has(i))) params.append("top", id);
      asks.push(getJSON(`/api/series?${params}`).then((answer) => ({ run, answer })));
    }
    if (lone.length) {
      const params = this.params(range, width);
      for (const id of lone) params.append("source", id);
      asks.push(getJSON(`/api/series?${params}`).then((answer) => ({ run: null, answer })));
    }
    this.fetchedFor = this.wantedFor();
    const answers = await Promise.all(asks);
    return {
      seq: Math.min(...answers.map((a) => a.answer.seq)),
      series: answers.flatMap((a) => a.answer.series),
      runs: answers.filter((a) => a.answer.aggregate).map((a) => ({ run: a.run, aggregate: a.answer.aggregate })),
    };
  }

  // What the data must have been fetched for; a change (mode, hidden or starred sources) makes render() re-fetch.
  // The table's worst few are asked for too, but a change among them waits for the next fetch (a zoom, a live
  // run's refresh): with 1,024 ranks the ranking moves often, and each re-fetch is a fold of every rank.
  wantedFor() {
    if (this.aggregated()) return `mean|${[...offChartSources()].sort()}|${[...view.pick].sort()}`;
    if (this.runsMode()) {
      const groups = this.runGroups().map((g) => `${g.run}:${g.ids.length}:${g.ids[0]}`);
      return `runs|${groups}|${[...offChartSources()].sort()}|${[...view.pick].sort()}|${[...view.expanded].sort()}`;
    }
    return "sources";
  }

  smoothing() {
    // Smoothed when the slider is on and this metric is smoothed by default, unless its chart flipped that.
    return view.smooth > 0 && smoothByDefault(this.metric) !== view.flip.has(this.metric);
  }

  points() {
    // About one bucket per pixel column: min/max buckets at that density hide nothing the screen could show.
    // With many sources overlaid each gets a share of MANY_SOURCES_POINTS; the server's mean needs no share.
    const width = Math.max(200, Math.min(2000, Math.round(this.plotSize().width)));
    if (this.aggregated()) return width;
    return Math.min(width, Math.max(50, Math.floor(MANY_SOURCES_POINTS / Math.max(1, state.sources.size))));
  }

  async fetch(range) {
    const ticket = ++this.fetches;
    const response = this.runsMode() ? await this.fetchRuns(range) : await getJSON(this.url(range, this.points()));
    // A zoomed answer that a later fetch overtook (zooms in quick succession) is not drawn over the later one.
    if (!range || ticket === this.fetches) this.load(response, range);
    return response;
  }

  // The whole history (and the zoomed range, exact, when zoomed); records that came meanwhile are added after
  // (those the answer holds are skipped by their seq).
  async refresh(stepsOf) {
    this.stale = false;
    this.loading = true;
    try {
      const answer = await this.fetch(null);
      const range = view.zoom ? stepsOf(this) : null;
      if (range) await this.fetch(range);
      return answer;
    } finally {
      this.loading = null;
      this.loaded = true;
      const held = this.held;
      this.held = [];
      for (const record of held) this.append(record);
    }
  }

  // The sources it shows (data-visible), kept current for charts off screen too (they are drawn when they come back).
  noteShown() {
    this.el.dataset.visible = [...new Set(this.sortedLines().map((l) => l.source))].filter((s) => !offChart(s)).join(",");
  }

  // Its points (data-points), noted when it is drawn or loaded, not per record (a DOM write each).
  notePoints() {
    let n = 0;
    for (const line of this.lines.values()) n += line.x.length;
    this.el.dataset.points = String(n);
  }

  load(response, range) {
    if (response.aggregate) this.loadAggregate(response.aggregate, range);
    else if (!range) { this.agg = null; this.outliers = new Set(); }
    if (!range) this.runAggs = new Map();
    for (const { run, aggregate } of response.runs || []) {
      this.runAggs.set(run, this.mergedAggregate(this.runAggs.get(run), aggregate, range));
    }
    const seen = new Set();
    for (const s of response.series) {
      const key = `${s.source}#${s.segment}`;
      seen.add(key);
      let line = this.lines.get(key);
      if (!line) { line = emptyLine(s.source, s.segment); this.lines.set(key, line); }
      const n = s.x.length;
      const fresh = {
        x: s.x, t: s.t || new Array(n).fill(null), s: s.samples || new Array(n).fill(null),
        last: s.last.map(num), min: s.min.map(num), max: s.max.map(num),
        smooth: s.smooth || new Array(n).fill(null),
      };
      if (range) {
        const i0 = bisectRight(line.x, range[0] - 1) + 1;
        const i1 = bisectRight(line.x, range[1]) + 1;
        for (const c of COLUMNS) line[c] = line[c].slice(0, i0).concat(fresh[c], line[c].slice(i1));
      } else {
        for (const c of COLUMNS) line[c] = fresh[c];
        if (n) this.latest.set(s.source, s.last[n - 1]);
      }
      line.served = line.x.length;
      if (s.smooth_state) line.ema = { ...s.smooth_state, w: view.smooth };
      else if (!range) line.ema = null;
      for (let i = 0; i < s.nonfinite.x.length; i++) {
        this.nonfinite.set(`${s.source}#${s.nonfinite.x[i]}`, { source: s.source, x: s.nonfinite.x[i], value: s.nonfinite.value[i] });
      }
    }
    if (!range) for (const key of [...this.lines.keys()]) if (!seen.has(key)) this.lines.delete(key);
    if (!range) this.seq = Math.max(this.seq, response.seq);
    this.dirty = true;
    this.notePoints();
  }

  loadAggregate(a, range) {
    this.agg = this.mergedAggregate(this.agg, a, range);
    this.outliers = new Set(a.outliers);
  }

  // A mean answered by the server, as a line (columns as a line's plus `n`), merged into the one held when zoomed.
  mergedAggregate(held, a, range) {
    const n = a.x.length;
    const fresh = { x: a.x, t: a.t, s: new Array(n).fill(null), last: a.mean.map(num), min: a.min.map(num),
      max: a.max.map(num), smooth: a.smooth || new Array(n).fill(null), n: a.n };
    const ema = a.smooth_state && this.smoothing() ? { ...a.smooth_state, w: view.smooth } : null;
    let line = held;
    if (range && held) {
      const served = Math.max(line.served ? line.x[line.served - 1] : -Infinity, n ? a.x[n - 1] : -Infinity);
      const i0 = bisectRight(line.x, range[0] - 1) + 1;
      const i1 = bisectRight(line.x, range[1]) + 1;
      for (const c of AGGREGATE_COLUMNS) line[c] = line[c].slice(0, i0).concat(fresh[c], line[c].slice(i1));
      line.served = bisectRight(line.x, served) + 1;
      if (ema) line.ema = ema;
      this.resmooth(line);
    } else {
      // `served`: the cells of the answer; the stream adds cells after them (steps newer than the answer's)
      line = { source: MEAN, segment: 0, ...fresh, sources: a.sources, served: n, ema };
      for (const [source, value] of Object.entries(a.latest || {})) this.latest.set(source, value);
    }
    for (let i = 0; i < a.nonfinite.x.length; i++) {
      const source = a.nonfinite.source[i];
      this.nonfinite.set(`${source}#${a.nonfinite.x[i]}`, { source, x: a.nonfinite.x[i], value: a.nonfinite.value[i] });
    }
    return line;
  }

  // A live record into the mean: the cell of its step takes it in (the answer's cells are each at one step, their
  // bucket's last), or, newer than the answer, it starts a cell of its own; a record inside an older bucket of
  // the answer (a slow rank) is left for the next fetch. Ranks come one after another within a read pass, so a
  // cell is filled over several records; the cells the stream made are smoothed by continuing the server's EMA.
  appendAggregate(a, record, y) {
    if (offChart(record.source) || !Number.isFinite(y)) return;
    const step = record.step;
    let i = bisectRight(a.x, step);
    if (i >= 0 && a.x[i] === step) {
      const count = a.n[i] || 0;
      a.last[i] = ((a.last[i] ?? 0) * count + y) / (count + 1);
      a.n[i] = count + 1;
      a.min[i] = Math.min(a.min[i] ?? y, y);
      a.max[i] = Math.max(a.max[i] ?? y, y);
    } else if (i >= a.served - 1) {
      i += 1;
      const time = typeof record.time === "number" ? record.time : null;
      for (const [c, v] of [["x", step], ["t", time], ["s", null], ["last", y], ["n", 1], ["min", y], ["max", y], ["smooth", null]]) {
        a[c].splice(i, 0, v);
      }
    } else {
      return;
    }
    if (i >= a.served - 1) this.resmooth(a);
    if (a.x.length - a.served > LIVE_CELLS_MAX) this.hooks.refetch(this);  // keeps resmooth short
    this.dirty = true;
  }

  // The smoothed mean of the cells the stream made: the server's EMA state after its last cell, folded on.
  resmooth(a) {
    if (!a.ema || !a.served) return;
    const i0 = a.served - 1;
    let ema = { num: (a.smooth[i0] ?? 0) * a.ema.den, den: a.ema.den, x: a.ema.x };
    for (let i = a.served; i < a.x.length; i++) {
      ema = foldEma(a.ema, ema, a.x[i], a.last[i]);
      a.smooth[i] = ema.den > 0 ? ema.num / ema.den : null;
    }
  }

  append(record) {
    if (!this.loaded) {
      // Not fetched yet: its fetch brings the history; keep only the latest value (the source cards show it),
      // and what arrives while the fetch is under way (it may be newer than the answer).
      const value = record[this.metric];
      if (num(value) !== null) this.latest.set(record.source, value);
      if (this.loading) this.held.push(record);
      return;
    }
    if (this.loading) {
      this.held.push(record);
      return;
    }
    if (record.seq <= this.seq) return;
    this.seq = record.seq;
    const value = record[this.metric];
    const y = num(value);
    if (y === null) return;
    const segment = record.segment || 0;
    const key = `${record.source}#${segment}`;
    let line = this.lines.get(key);
    const agg = this.agg || this.runAggs.get((state.sources.get(record.source) || {}).run || "");
    if (agg) {
      // The mean takes every source (of its run); only the sources drawn on top keep lines of their own.
      this.appendAggregate(agg, record, y);
      if (!line) {
        this.noteValue(record, value, y);
        return;
      }
    }
    if (!line) { line = emptyLine(record.source, segment); this.lines.set(key, line); }
    const n = line.x.length;
    if (n && record.step <= line.x[n - 1]) return;  // already in a fetched answer
    const finite = Number.isFinite(y);
    line.x.push(record.step);
    line.t.push(typeof record.time === "number" ? record.time : null);
    line.s.push(samplesOf(record));
    line.last.push(y);
    line.min.push(finite ? y : null);
    line.max.push(finite ? y : null);
    line.smooth.push(this.continueEma(line, record.step, finite ? y : null));
    this.noteValue(record, value, y);
    this.dirty = true;
    if (line.x.length - line.served > LIVE_POINTS_MAX) halveStreamed(line);
  }

  // A record's value as the latest of its source, and as a marker when it is not finite.
  noteValue(record, value, y) {
    if (!Number.isFinite(y)) this.nonfinite.set(`${record.source}#${record.step}`, { source: record.source, x: record.step, value });
    this.latest.set(record.source, value);
  }

  continueEma(line, step, y) {
    // The server's EMA continued exactly: its debias denominator and last step came with the last answer.
    const ema = line.ema;
    if (!this.smoothing() || !ema || ema.w !== view.smooth) return null;
    const prev = line.smooth.length ? line.smooth[line.smooth.length - 1] : null;
    if (y === null) return prev;
    const dx = ema.x === null ? ema.stride : step - ema.x;
    const d = dx === ema.stride || dx <= 0 ? ema.w : Math.pow(ema.w, dx / ema.stride);
    const numerator = prev === null ? 0 : prev * ema.den;
    ema.den = d * ema.den + (1 - d);
    ema.x = step;
    return (d * numerator + (1 - d) * y) / ema.den;
  }

  // ---- x axis ----------------------------------------------------------------------------------------
  disp(line, i) {
    switch (view.x) {
      case "time": return line.t[i] === null ? null : line.t[i] * 1000;
      case "relative": {
        const t0 = line.source === MEAN ? Math.min(...state.firstTime.values()) : state.firstTime.get(line.source);
        return line.t[i] === null || t0 === undefined ? null : line.t[i] - t0;
      }
      case "samples": return line.s[i];
      default: return line.x[i];
    }
  }

  // Where a step of a source sits on the current x axis (events, NaN marks): its own time for time axes,
  // else the nearest logged point at or before it.
  dispOfStep(source, step, time) {
    if (view.x === "step") return step;
    if (view.x === "time" && typeof time === "number") return time * 1000;
    if (view.x === "relative" && typeof time === "number" && state.firstTime.has(source)) return time - state.firstTime.get(source);
    for (const line of this.lines.values()) {
      if (line.source !== source || !line.x.length || step < line.x[0] || step > line.x[line.x.length - 1]) continue;
      const i = Math.max(0, bisectRight(line.x, step));
      return this.disp(line, i);
    }
    return null;
  }

  // Its lines and, with many sources, the mean.
  allLines() {
    return [...this.lines.values(), ...(this.agg ? [this.agg] : []), ...this.runAggs.values()];
  }

  xRange() {
    let lo = Infinity;
    let hi = -Infinity;
    for (const line of this.allLines()) {
      if (offChart(line.source)) continue;
      for (const i of [0, line.x.length - 1]) {
        if (i < 0) continue;
        const v = this.disp(line, i);
        if (v !== null && Number.isFinite(v)) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
      }
    }
    return lo <= hi ? [lo, hi] : null;
  }

  // The steps behind a range of the x axis (zoom -> /api/series start/end).
  stepsOf(range) {
    if (view.x === "step") return [Math.floor(range[0]), Math.ceil(range[1])];
    let lo = Infinity;
    let hi = -Infinity;
    for (const line of this.allLines()) {
      for (let i = 0; i < line.x.length; i++) {
        const v = this.disp(line, i);
        if (v === null) continue;
        if (v >= range[0] && v <= range[1]) {
          lo = Math.min(lo, line.x[Math.max(0, i - 1)]);
          hi = Math.max(hi, line.x[Math.min(line.x.length - 1, i + 1)]);
        }
      }
    }
    return lo <= hi ? [lo, hi] : null;
  }

  // ---- drawing -----------------------------------------------------------------------------------------
  value(line, i) {
    // The y of the main line: smoothed when smoothing is on.
    return this.smoothing() && line.smooth[i] !== null && line.smooth[i] !== undefined ? line.smooth[i] : line.last[i];
  }

  sortedLines() {
    return [...this.lines.values()].sort((a, b) => natural(a.source, b.source) || a.segment - b.segment);
  }

  yOk(y) {
    if (y === null || y === undefined || !Number.isFinite(y)) return null;
    return view.log.has(this.metric) && y <= 0 ? null : y;
  }

  overlaySeries(lines) {
    const series = [];
    const smoothing = this.smoothing();
    const base = view.baseline && view.baseline !== "" ? this.baselineLookup() : null;
    for (const line of lines) {
      if (base && line.source === view.baseline) continue;
      const color = colorOf(line.source);
      const id = `${line.source}#${line.segment}`;
      const n = line.x.length;
      const raw = new Array(n);
      const smooth = smoothing ? new Array(n) : null;
      let banded = false;
      for (let i = 0; i < n; i++) {
        const x = this.disp(line, i);
        let r = line.last[i];
        let s = smoothing ? line.smooth[i] : null;
        if (base) {
          const b = base(line.x[i]);
          r = b === null || r === null ? null : r - b.raw;
          s = b === null || s === null ? null : s - b.smooth;
        }
        raw[i] = [x, base ? (Number.isFinite(r) ? r : null) : this.yOk(r)];
        if (smoothing) smooth[i] = [x, base ? (Number.isFinite(s) ? s : null) : this.yOk(s)];
        if (!banded && line.min[i] !== line.max[i]) banded = true;
      }
      if (banded && !base) {
        // The raw min/max of each bucket as a band under the lines: a spike inside a bucket still shows.
        const band = [];
        for (let i = 0; i < n; i++) band.push([this.disp(line, i), this.yOk(line.min[i]), this.yOk(line.max[i])]);
        series.push(bandSeries(`${id}|band`, line.source, color, band));
      }
      // The raw line stays clearly visible under the smoothed one; every point shows as a dot when there are
      // few, and a point with no neighbour (a single point, or one between gaps) always does.
      series.push({
        id: `${id}|raw`, name: line.source, type: "line", data: raw, color, connectNulls: false,
        showSymbol: n < 60, symbolSize: smoothing ? 4 : 5, emphasis: { disabled: true },
        itemStyle: { opacity: smoothing ? 0.6 : 1 },
        lineStyle: { width: smoothing ? 1.2 : 1.5, opacity: smoothing ? 0.55 : 1 },
      });
      const lone = n < 60 ? [] : raw.filter((p, i) => p[1] !== null && p[0] !== null
        && !(i > 0 && raw[i - 1][1] !== null) && !(i + 1 < n && raw[i + 1][1] !== null));
      if (lone.length) {
        series.push({ id: `${id}|lone`, name: line.source, type: "scatter", data: lone, color, symbolSize: 6,
          emphasis: { disabled: true }, tooltip: { show: false } });
      }
      if (smoothing) {
        series.push({ id: `${id}|smooth`, name: line.source, type: "line", data: smooth, color, connectNulls: true,
          showSymbol: false, emphasis: { disabled: true }, lineStyle: { width: 2 } });
      }
    }
    return series;
  }

  baselineLookup() {
    // Step-aligned: the baseline's value at the same step, else at the closest step before it when that is no
    // farther than the baseline's own spacing there (bucketed answers of runs of different lengths).
    const lines = [...this.lines.values()].filter((l) => l.source === view.baseline);
    if (!lines.length) return null;
    const xs = [];
    for (const line of lines) for (let i = 0; i < line.x.length; i++) xs.push([line.x[i], line.last[i], this.value(line, i)]);
    xs.sort((a, b) => a[0] - b[0]);
    const steps = xs.map((p) => p[0]);
    return (step) => {
      const i = bisectRight(steps, step);
      if (i < 0) return null;
      if (steps[i] !== step) {
        const gap = i + 1 < steps.length ? steps[i + 1] - steps[i] : (i > 0 ? steps[i] - steps[i - 1] : 0);
        if (step - steps[i] > gap) return null;
      }
      return { raw: xs[i][1], smooth: xs[i][2] };
    };
  }

  meanSeries(lines) {
    // Many ranks: the mean over the shown sources and the min-max band across them, per step; the starred, the
    // worst (the source table's) and the outlying (the server's) sources drawn on top, each in its own colour.
    // The server's mean when it sent one; else (a few sources shown as the mean) computed here.
    const color = themeColors().mean;
    const top = lines.filter((l) => this.onTop(l.source));
    const a = this.agg;
    if (a) {
      const band = a.x.map((_, i) => [this.disp(a, i), this.yOk(a.min[i]), this.yOk(a.max[i])]);
      const mean = a.x.map((_, i) => [this.disp(a, i), this.yOk(this.value(a, i))]);
      return [
        bandSeries("mean|band", "min–max", color, band),
        { id: "mean|line", name: `mean of ${a.sources}`, type: "line", symbol: a.x.length === 1 ? "circle" : "none",
          color, lineStyle: { width: 2 }, emphasis: { disabled: true }, data: mean },
        ...this.overlaySeries(top).map((s) => ({ ...s, z: 3 })),
      ];
    }
    return [...this.localMeanSeries("mean", "", color, lines), ...this.overlaySeries(top).map((s) => ({ ...s, z: 3 }))];
  }

  // The mean of some sources' lines and their min-max band, computed here from the lines (few sources, or one run
  // of several compared).
  localMeanSeries(id, prefix, color, lines) {
    const byStep = new Map();
    for (const line of lines) {
      for (let i = 0; i < line.x.length; i++) {
        const y = this.value(line, i);
        if (y === null || !Number.isFinite(y)) continue;
        let cell = byStep.get(line.x[i]);
        if (!cell) { cell = { x: this.disp(line, i), sum: 0, n: 0, lo: Infinity, hi: -Infinity }; byStep.set(line.x[i], cell); }
        cell.sum += y;
        cell.n += 1;
        cell.lo = Math.min(cell.lo, Number.isFinite(line.min[i]) ? Math.min(line.min[i], y) : y);
        cell.hi = Math.max(cell.hi, Number.isFinite(line.max[i]) ? Math.max(line.max[i], y) : y);
      }
    }
    const cells = [...byStep.entries()].sort((p, q) => p[0] - q[0]).map((e) => e[1]);
    const ranks = new Set(lines.map((l) => l.source)).size;
    return [
      bandSeries(`${id}|band`, `${prefix}min–max`, color, cells.map((c) => [c.x, this.yOk(c.lo), this.yOk(c.hi)])),
      { id: `${id}|line`, name: `${prefix}mean of ${ranks}`, type: "line", symbol: cells.length === 1 ? "circle" : "none",
        color, lineStyle: { width: 2 }, emphasis: { disabled: true }, data: cells.map((c) => [c.x, this.yOk(c.sum / c.n)]) },
    ];
  }

  // Runs compared, some of several ranks: per run, the mean of its shown ranks and their band (in the run's colour),
  // a run of one rank as its line; starred ranks drawn on top ("overlay" draws every rank).
  runSeries(lines) {
    const byRun = new Map();
    for (const run of this.runAggs.keys()) byRun.set(run, []);
    for (const line of lines) {
      const run = (state.sources.get(line.source) || {}).run || "";
      if (!byRun.has(run)) byRun.set(run, []);
      byRun.get(run).push(line);
    }
    const series = [];
    this.runNames = new Map();
    for (const [run, runLines] of byRun) {
      const agg = this.runAggs.get(run);
      if (agg) {
        // The server's mean of the run's ranks and their band; its ranks (expanded, or starred) thin on top.
        const name = `${run}: mean of ${agg.sources}`;
        const color = colorOf([...state.sources.values()].find((i) => (i.run || "") === run).id);
        this.runNames.set(name, run);
        series.push(bandSeries(`run ${run}|band`, `${run}: min–max`, color,
          agg.x.map((_, i) => [this.disp(agg, i), this.yOk(agg.min[i]), this.yOk(agg.max[i])])));
        series.push({ id: `run ${run}|line`, name, type: "line", symbol: agg.x.length === 1 ? "circle" : "none", color,
          lineStyle: { width: 2 }, emphasis: { disabled: true }, z: 2,
          data: agg.x.map((_, i) => [this.disp(agg, i), this.yOk(this.value(agg, i))]) });
        series.push(...this.overlaySeries(runLines).map((s) => ({ ...s, z: 3 })));
        continue;
      }
      if (new Set(runLines.map((l) => l.source)).size < 2) { series.push(...this.overlaySeries(runLines)); continue; }
      series.push(...this.localMeanSeries(`run ${run}`, `${run}: `, colorOf(runLines[0].source), runLines));
      series.push(...this.overlaySeries(runLines.filter((l) => view.pick.has(l.source))).map((s) => ({ ...s, z: 3 })));
    }
    return series;
  }

  // Runs are compared by their means: the ranks mode is auto, several runs, one of them with several shown ranks.
  byRuns(shownLines) {
    if (view.ranks !== "auto" || view.baseline || !comparingRuns()) return false;
    const seen = new Map();
    for (const line of shownLines) {
      const run = (state.sources.get(line.source) || {}).run || "";
      if (!seen.has(run)) seen.set(run, line.source);
      else if (seen.get(run) !== line.source) return true;
    }
    return false;
  }

  // A source's run ("" for none): a run's mean's legend name is not a source (see runSeries).
  runOf(name) {
    const info = state.sources.get(name);
    return info ? info.run || "" : null;
  }

  onTop(source) {
    return view.pick.has(source) || state.worst.has(source) || this.outliers.has(source);
  }

  // x-axis units per pixel of the plot (for "closer than N px" decisions: marker stacks, alert labels).
  unitsPerPixel() {
    const range = view.zoom || state.extent;
    const width = Math.max(100, this.plotSize().width - 74);
    return range ? (range[1] - range[0]) / width : 1;
  }

  markerSeries() {
    // Markers never hide each other: glyphs closer than MARKER_GAP_PX on the x axis share a place (the first one's
    // x), kinds stacked there (one level per kind, in EVENT_KINDS order); the same kind there is one glyph (its
    // newest event, with a count). Places are made left to right, so two are always MARKER_GAP_PX or more apart.
    const marks = [];  // {x, kind, item}
    const push = (item, kind, source, step, time) => {
      if (offChart(source)) return;
      const x = this.dispOfStep(source, step, time);
      if (x !== null && x !== undefined) marks.push({ x, kind, item });
    };
    const firstStep = new Map();
    for (const line of this.lines.values()) {
      if (line.x.length && !(firstStep.get(line.source) <= line.x[0])) firstStep.set(line.source, line.x[0]);
    }
    for (const event of state.events) {
      if (!EVENT_STYLE[event.kind]) continue;
      // A start logged before the first step sits at that first step.
      const step = typeof event.step === "number" ? event.step : event.kind === "start" ? firstStep.get(event.source) : undefined;
      // (placed by its step's record when its own time is only when mstail read it)
      if (typeof step === "number") push(event, event.kind, event.source, step, readTime(event) ? null : event.time);
    }
    const overflow = state.charts.get("overflow");
    if (overflow) {
      for (const line of overflow.allLines()) {
        for (let i = 0; i < line.x.length; i++) {
          if (line.max[i] >= 1) push({ kind: "overflow", source: line.source, step: line.x[i], message: "overflow cond: True" }, "overflow", line.source, line.x[i], line.t[i]);
        }
      }
    }
    const gap = this.unitsPerPixel() * MARKER_GAP_PX;
    const places = [];  // {x, kinds: kind -> {x, item, count}}
    for (const mark of marks.sort((a, b) => a.x - b.x)) {
      let place = places[places.length - 1];
      if (!place || mark.x - place.x >= gap) places.push(place = { x: mark.x, kinds: new Map() });
      const known = place.kinds.get(mark.kind);
      if (known) { known.count += 1; known.item = mark.item; } else place.kinds.set(mark.kind, { x: place.x, item: mark.item, count: 1 });
    }
    const items = [];
    for (const { kinds } of places) {
      let level = 0;
      for (const kind of EVENT_KINDS) {
        const mark = kinds.get(kind);
        if (!mark) continue;
        const style = EVENT_STYLE[kind];
        items.push({ value: [mark.x, MARKER_BASE_Y + level * MARKER_STEP_Y], symbol: `path://${style.path}`,
          symbolSize: style.size, itemStyle: { color: style.color }, item: mark.item, count: mark.count });
        level += 1;
      }
    }
    items.sort((a, b) => a.value[0] - b.value[0]);
    const shown = items.length > MAX_MARKERS ? items.slice(items.length - MAX_MARKERS) : items;
    this.el.dataset.markers = String(shown.length);
    return { id: "events", name: "events", type: "scatter", yAxisIndex: 1, data: shown, z: 5, cursor: "pointer",
      tooltip: { show: false }, emphasis: { scale: 1.4 } };
  }

  nonfiniteSeries() {
    const marks = [];
    for (const p of this.nonfinite.values()) {
      if (offChart(p.source)) continue;
      const x = this.dispOfStep(p.source, p.x, null);
      if (x !== null && x !== undefined) marks.push({ xAxis: x, text: `${p.value} @ ${p.x}` });
    }
    const shown = marks.slice(-MAX_NAN_LINES).sort((a, b) => a.xAxis - b.xAxis);
    const labels = shown.length <= 12;
    if (labels) mergeLabels(shown, labelsMeet(this.unitsPerPixel()));
    return {
      id: "nonfinite", name: "non-finite", type: "line", data: [], color: NAN_COLOR, silent: true,
      markLine: { symbol: ["none", "circle"], symbolSize: 6, silent: true, animation: false,
        lineStyle: { color: NAN_COLOR, type: "dashed", width: 1.5 },
        label: { show: labels, formatter: (p) => String(p.data.text), color: NAN_COLOR, fontSize: 10 },
        data: shown },
    };
  }

  alertSeries() {
    const marks = this.metric === "loss" ? this.hooks.alertMarks() : [];
    this.el.dataset.alertMarks = String(marks.length);
    // One line per alert step; labels closer than ALERT_LABEL_GAP_PX are merged into the first ("… +2").
    const placed = [];
    for (const m of marks) {
      const x = this.dispOfStep(m.source, m.step, null);
      if (x !== null && x !== undefined) placed.push({ xAxis: x, text: m.text });
    }
    placed.sort((a, b) => a.xAxis - b.xAxis);
    const gap = this.unitsPerPixel() * ALERT_LABEL_GAP_PX;
    mergeLabels(placed, (head, mark) => mark.xAxis - head.xAxis < gap);  // labels along their lines: a fixed gap
    const shown = placed.map(({ xAxis, text, label }) => (label ? { xAxis, text, label } : { xAxis, text }));
    this.el.dataset.alertLabels = String(shown.filter((m) => !m.label).length);
    return {
      id: "alerts", name: "alerts", type: "line", data: [], color: NAN_COLOR, silent: true,
      markLine: { symbol: "none", silent: true, animation: false,
        lineStyle: { color: NAN_COLOR, type: "solid", width: 1, opacity: 0.7 },
        label: { formatter: (p) => String(p.data.text), color: NAN_COLOR, position: "insideEndTop", fontSize: 10 },
        data: shown },
    };
  }

  xAxisOption() {
    const c = themeColors();
    const common = {
      min: state.extent ? state.extent[0] : null, max: state.extent ? state.extent[1] : null,
      axisLine: { lineStyle: { color: c.axis } }, axisLabel: { color: c.muted, hideOverlap: true },
      splitLine: { show: false },
    };
    // A log without timestamps (LossMonitor's print()) is drawn at the moments mstail read its lines: said on the axis.
    const timeNote = { name: this.readTimes() ? "read time" : "", nameLocation: "start", nameGap: 6,
      nameTextStyle: { color: c.muted, fontSize: 10, align: "left", verticalAlign: "top", padding: [18, 0, 0, 0] } };
    if (view.x === "time") return { ...common, ...timeNote, type: "time" };
    if (view.x === "relative") return { ...common, ...timeNote, type: "value", axisLabel: { ...common.axisLabel, formatter: (v) => fmtDuration(v) } };
    return { ...common, type: "value", name: "",
      axisLabel: { ...common.axisLabel, formatter: (v) => fmtTick(v, this.interval("xAxis")) } };
  }

  // Whether a source drawn here has times that are the moments its lines were read (`read_times` of /api/sources: a
  // column of its compact table, a counter of its full entries).
  readTimes() {
    for (const line of this.lines.values()) {
      const info = state.sources.get(line.source);
      if (info && (info.read_times || info.counters?.read_times || 0) > 0) return true;
    }
    return false;
  }

  interval(axis) {
    // The tick spacing ECharts chose (read while it formats the labels), for just-enough label precision.
    try {
      return this.chart.getModel().getComponent(axis, 0).axis.scale.getInterval() || 0;
    } catch (err) {
      return 0;
    }
  }

  yLabels() {
    const axis = this.chart.getModel().getComponent("yAxis", 0).axis;
    const ctx = document.createElement("canvas").getContext("2d");
    ctx.font = "12px sans-serif";
    return axis.getViewLabels().map((l) => [l.formattedLabel, ctx.measureText(l.formattedLabel).width]);
  }

  render() {
    if (!this.chart) return;
    this.dirty = false;
    const c = themeColors();
    const lines = this.sortedLines().filter((l) => !filteredOut(l.source));
    const shownLines = lines.filter((l) => !view.hidden.has(l.source));
    const shownSources = [...new Set(shownLines.map((l) => l.source))];
    if (this.loaded && !this.refreshing && this.fetchedFor !== this.wantedFor()) this.hooks.refetch(this);
    const mean = this.agg ? meanMode(shownSourcesOf(this.metric)) : meanMode(shownSources.length);
    const meanOf = this.agg ? this.agg.sources : shownSources.length;
    const runs = !mean && ((this.runAggs.size > 0 && this.runsMode()) || this.byRuns(shownLines));
    const series = mean ? this.meanSeries(shownLines) : runs ? this.runSeries(shownLines) : this.overlaySeries(lines);
    const lineIds = series.map((s) => s.id).join("\n");
    // Marker series only when they have something to show: an empty markLine still costs a redraw.
    for (const extra of [this.markerSeries(), this.nonfiniteSeries(), this.alertSeries()]) {
      if ((extra.data && extra.data.length) || (extra.markLine && extra.markLine.data.length)) series.push(extra);
    }
    const sources = [...new Set(lines.map((l) => l.source))];
    const legendNames = mean ? [`mean of ${meanOf}`, "min–max", ...shownSources.filter((s) => this.onTop(s))]
      : runs ? [...new Set(series.filter((s) => /\|(raw|line)$/.test(s.id) && !this.runAggs.has(this.runOf(s.name))).map((s) => s.name))]
        : sources.filter((s) => !(view.baseline && s === view.baseline));
    const legendRows = this.legendRows(legendNames);
    this.el.dataset.legendRows = String(legendRows);
    const selected = {};
    for (const s of sources) if (!mean || this.onTop(s)) selected[s] = !offChart(s);
    if (runs) for (const name of this.runNames.keys()) selected[name] = true;  // a click expands it, never hides it
    const logScale = view.log.has(this.metric);
    const fit = view.fit.has(this.metric) ? robustRange(series, logScale) : null;
    const zoom = {};
    if (this.fresh && view.zoom) Object.assign(zoom, { startValue: view.zoom[0], endValue: view.zoom[1] });
    this.fresh = false;
    // Series replaced under a shown tooltip: ECharts would show it again from the removed series (TypeErrors in
    // getDataParams) with the old view's values; hidden now, it is drawn afresh at the next mouse move.
    // (The markers' series come and go with the events; the tooltip does not show them.)
    if (lineIds !== this.seriesIds) {
      this.chart.dispatchAction({ type: "hideTip" });
      this.chart.dispatchAction({ type: "updateAxisPointer", currTrigger: "leave" });
      this.seriesIds = lineIds;
    }
    this.chart.setOption({
      legend: { data: legendNames, selected, show: legendRows <= LEGEND_ROWS_MAX, textStyle: { color: c.text, lineHeight: 14 } },
      grid: { top: 14 + LEGEND_ROW_PX * (legendRows <= LEGEND_ROWS_MAX ? legendRows : 1) },
      tooltip: { backgroundColor: c.tooltip, borderColor: c.axis, textStyle: { color: c.text, fontSize: 12 } },
      xAxis: this.xAxisOption(),
      yAxis: [{
        type: logScale ? "log" : "value", scale: true, name: view.baseline ? `Δ vs ${view.baseline}` : "",
        nameTextStyle: { color: c.muted, align: "left" }, nameGap: 6,
        // A log axis spans the data, not the whole decades around it (loss 4-10 is not drawn on 1-100).
        min: fit ? fit[0] : logScale ? (e) => e.min : null, max: fit ? fit[1] : logScale ? (e) => e.max : null,
        axisLine: { show: false },
        axisLabel: { color: c.muted, formatter: (v) => (logScale ? fmtAxis(v) : fmtTick(v, this.interval("yAxis"))) },
        splitLine: { lineStyle: { color: c.split } },
      }, { type: "value", min: 0, max: 1, show: false }],
      dataZoom: [{ ...zoom }, { ...zoom, borderColor: c.axis, textStyle: { color: c.muted }, fillerColor: "rgba(51,112,255,0.15)",
        moveHandleStyle: { color: c.axis }, handleStyle: { color: c.panel, borderColor: c.muted } }],
      series,
    }, { replaceMerge: ["series"] });
    const ds = this.el.dataset;
    this.notePoints();
    ds.drawn = "1";
    ds.mode = mean ? "mean" : runs ? "runs" : "overlay";
    ds.aggregate = this.agg ? "server" : runs && this.runAggs.size ? "runs" : "";
    ds.expanded = runs ? [...this.runNames.values()].filter((r) => view.expanded.has(r)).join(",") : "";
    ds.smoothed = this.smoothing() ? "1" : "0";
    ds.nonfinite = String(this.nonfinite.size);
    ds.bucketed = lines.some((l) => l.min.some((v, i) => v !== l.max[i])) ? "1" : "0";
    this.noteShown();
    ds.log = logScale ? "1" : "0";
    ds.x = view.x;
    ds.fit = fit ? fit.join(",") : "";
    this.fitButton.classList.toggle("on", view.fit.has(this.metric));
    this.fitButton.setAttribute("aria-pressed", String(view.fit.has(this.metric)));
    this.logButton.classList.toggle("on", logScale);
    this.logButton.setAttribute("aria-pressed", String(logScale));
    this.smoothButton.classList.toggle("on", this.smoothing());
    this.smoothButton.setAttribute("aria-pressed", String(this.smoothing()));
    this.smoothButton.disabled = !(view.smooth > 0);
    this.latestEl.textContent = this.latestText();
  }

  // The rows the legend's names take across the plot (each: the swatch, its text, the gap).
  legendRows(names) {
    if (!measureCtx) measureCtx = document.createElement("canvas").getContext("2d");
    measureCtx.font = "11px sans-serif";  // (the NaN labels' measure is 10 px: mergeLabels)
    const width = this.plotSize().width - 10;
    let rows = 1;
    let x = 0;
    for (const name of names) {
      const w = 14 + 5 + measureCtx.measureText(name).width + LEGEND_GAP_PX;
      if (x > 0 && x + w > width) { rows += 1; x = 0; }
      x += w;
    }
    return rows;
  }

  latestText() {
    // The newest value per shown source; with many sources their mean and range.
    const values = [...this.latest.entries()].filter(([s]) => !offChart(s)).sort((a, b) => natural(a[0], b[0]));
    if (values.length <= 4) return values.map(([source, v]) => `${source}: ${fmt(v)}`).join("  ");
    const finite = values.map(([, v]) => num(v)).filter((v) => v !== null && Number.isFinite(v));
    if (!finite.length) return `${values.length} sources`;
    const mean = finite.reduce((a, b) => a + b, 0) / finite.length;
    return `mean ${fmt(mean)} · ${fmt(Math.min(...finite))} … ${fmt(Math.max(...finite))} over ${values.length} sources`;
  }

  // One row per line (raw and smoothed side by side, a colour swatch), in the order the toolbar asks for (nearest
  // the mouse, ascending, descending); past a screenful the first rows and "and N more".
  tooltip(params) {
    const list = Array.isArray(params) ? params : [params];
    if (!list.length) return "";
    const x = list[0].axisValue;
    const head = view.x === "time" ? new Date(x).toLocaleString() : view.x === "relative" ? `+${fmtDuration(x)}` : `${view.x} ${fmtAxis(x)}`;
    const rows = new Map();  // line id -> {name, color, raw, smooth}
    for (const p of list) {
      const id = String(p.seriesId || "");
      const kind = id.match(/\|(raw|smooth|line)$/);
      if (!kind || !Array.isArray(p.value) || p.value[1] === null || p.value[1] === undefined) continue;
      const key = id.slice(0, id.length - kind[0].length);
      let row = rows.get(key);
      if (!row) { row = { key, name: this.rowName(key, p), color: p.color, raw: null, smooth: null }; rows.set(key, row); }
      row[kind[1] === "smooth" ? "smooth" : "raw"] = p.value[1];
    }
    const sorted = this.sortRows([...rows.values()]);
    const room = tipRows();
    const box = document.createElement("div");
    box.className = "tip";
    box.dataset.metric = this.metric;
    const title = document.createElement("div");
    title.className = "tip-head";
    title.textContent = head;
    box.append(title);
    for (const row of sorted.slice(0, room)) box.append(tipRow(row, this.smoothing()));
    if (sorted.length > room) {
      const more = document.createElement("div");
      more.className = "tip-more";
      more.textContent = `and ${sorted.length - room} more`;
      box.append(more);
    }
    box.dataset.rows = String(Math.min(room, sorted.length));
    box.dataset.more = String(Math.max(0, sorted.length - room));
    return box;
  }

  // A tooltip row's name: its line's (a source; a metric and a source in the matching metrics' chart).
  rowName(key, p) {
    return p.seriesName;
  }

  sortRows(rows) {
    const key = (r) => (r.smooth !== null ? r.smooth : r.raw);
    const finite = (v) => (typeof v === "number" && Number.isFinite(v) ? v : null);
    const byName = (a, b) => natural(a.name, b.name);
    // Lines without a finite value here come last, in name order.
    const order = (rank) => rows.sort((a, b) => {
      const ra = rank(a);
      const rb = rank(b);
      return ra === rb ? byName(a, b) : ra === null ? 1 : rb === null ? -1 : ra - rb;
    });
    if (view.tipSort === "ascending") return order((r) => finite(key(r)));
    if (view.tipSort === "descending") return order((r) => (finite(key(r)) === null ? null : -key(r)));
    let target = null;
    try {
      target = this.mouseY === undefined ? null : this.chart.convertFromPixel({ yAxisIndex: 0 }, this.mouseY - this.plot.getBoundingClientRect().top);
    } catch (err) {
      target = null;
    }
    if (typeof target !== "number" || !Number.isFinite(target)) return rows.sort(byName);
    return order((r) => (finite(key(r)) === null ? null : Math.abs(key(r) - target)));
  }

  // The tooltip next to the mouse, on the side with room, always inside the window (it lives on the page's body).
  tipPosition(point, dom, size) {
    dom.classList.toggle("elsewhere", !this.hovered);
    const plot = this.plot.getBoundingClientRect();
    const [w, h] = size;
    const margin = 8;
    let left = plot.left + point[0] + 16;
    if (left + w > window.innerWidth - margin) left = plot.left + point[0] - w - 16;
    left = Math.max(margin, Math.min(left, window.innerWidth - w - margin));
    const top = Math.max(margin, Math.min(plot.top + point[1] - h / 2, window.innerHeight - h - margin));
    return [left - plot.left, top - plot.top];
  }

  // ---- export ----------------------------------------------------------------------------------------
  visibleRows() {
    const range = view.zoom;
    const rows = [["source", "segment", "step", "time", "time_s", "samples", "value", "min", "max", "smoothed"]];
    for (const line of this.sortedLines()) {
      if (offChart(line.source)) continue;
      for (let i = 0; i < line.x.length; i++) {
        const x = this.disp(line, i);
        if (range && (x === null || x < range[0] || x > range[1])) continue;
        rows.push([line.source, line.segment, line.x[i], isoTime(line.t[i]), line.t[i], line.s[i], line.last[i], line.min[i], line.max[i],
          this.smoothing() ? line.smooth[i] : null]);
      }
    }
    const means = [...(this.agg ? [["", this.agg]] : []), ...[...this.runAggs].map(([run, a]) => [`${run}: `, a])];
    for (const [prefix, a] of means) {
      for (let i = 0; i < a.x.length; i++) {
        const x = this.disp(a, i);
        if (range && (x === null || x < range[0] || x > range[1])) continue;
        rows.push([`${prefix}mean of ${a.sources}`, "", a.x[i], isoTime(a.t[i]), a.t[i], "", a.last[i], a.min[i], a.max[i],
          this.smoothing() ? a.smooth[i] : null]);
      }
    }
    return rows;
  }

  exportCSV() {
    const text = this.visibleRows().map((row) => row.map((v) => csvCell(typeof v === "number" && !Number.isFinite(v) ? String(v) : v)).join(",")).join("\n") + "\n";
    const url = URL.createObjectURL(new Blob([text], { type: "text/csv" }));
    download(`mstail-${safeName(this.metric)}.csv`, url);
    setTimeout(() => URL.revokeObjectURL(url), 10_000);
  }

  async exportPNG() {
    await this.hooks.ready(this);
    const url = this.chart.getDataURL({ type: "png", pixelRatio: 2, backgroundColor: themeColors().panel });
    download(`mstail-${safeName(this.metric)}.png`, url);
  }
}

const ownSize = (plot) => ({ width: plot.clientWidth || 600, height: plot.clientHeight || 270 });

// The chart filter's matches in one chart (the toolbar's "one chart"): one line per metric and source (the mean of
// a metric drawn as a mean), a colour and a legend entry per metric, the tooltip's rows named "metric · source". It
// draws its members' data (the metrics' own charts fetch it and take the live records): it fetches nothing itself.
export const MATCHING = "matching metrics";  // its box's data-metric (never a metric: a space is not in a name)

export class MetricsChart extends ChartView {
  constructor(hooks) {
    super(MATCHING, hooks);
    this.el.classList.add("combined");
    this.members = [];
    this.labels = new Map();  // line key -> its tooltip name
  }

  setMembers(charts) {
    this.members = charts;
    this.el.querySelector(".name").textContent = charts.map((c) => c.metric).join(" · ");
    this.dirty = true;
  }

  plotSize() {
    return ownSize(this.plot);
  }

  smoothing() {
    return false;  // each member's line is drawn as its own chart draws it (smoothed or not): one value per row
  }

  rowName(key) {
    return this.labels.get(key) || key;
  }

  // A member's lines: the server's mean when its chart draws one, else its shown sources' lines.
  memberLines(chart) {
    if (chart.agg && meanMode(shownSourcesOf(chart.metric))) return [chart.agg];
    return chart.sortedLines().filter((l) => !offChart(l.source));
  }

  render() {
    if (!this.chart) return;
    this.dirty = false;
    const c = themeColors();
    const series = [];
    this.labels.clear();
    this.members.forEach((chart, k) => {
      const color = colorAt(k);
      const lines = this.memberLines(chart);
      for (const line of lines) {
        const key = `${chart.metric}/${line.source}#${line.segment}`;
        const who = line.source === MEAN ? `mean of ${line.sources}` : line.source;
        this.labels.set(key, lines.length > 1 || line.source === MEAN ? `${chart.metric} · ${who}` : chart.metric);
        const data = line.x.map((_, i) => [chart.disp(line, i), chart.yOk(chart.value(line, i))]);
        series.push({ id: `${key}|line`, name: chart.metric, type: "line", data, color, connectNulls: false,
          showSymbol: line.x.length < 60, symbolSize: 4, emphasis: { disabled: true }, lineStyle: { width: 1.5 } });
      }
    });
    const lineIds = series.map((s) => s.id).join("\n");
    if (lineIds !== this.seriesIds) {
      this.chart.dispatchAction({ type: "hideTip" });
      this.chart.dispatchAction({ type: "updateAxisPointer", currTrigger: "leave" });
      this.seriesIds = lineIds;
    }
    const names = this.members.map((m) => m.metric);
    const legendRows = Math.min(LEGEND_ROWS_MAX, this.legendRows(names));
    const zoom = {};
    if (this.fresh && view.zoom) Object.assign(zoom, { startValue: view.zoom[0], endValue: view.zoom[1] });
    this.fresh = false;
    this.chart.setOption({
      legend: { data: names, textStyle: { color: c.text, lineHeight: 14 } },
      grid: { top: 14 + LEGEND_ROW_PX * legendRows },
      tooltip: { backgroundColor: c.tooltip, borderColor: c.axis, textStyle: { color: c.text, fontSize: 12 } },
      xAxis: this.xAxisOption(),
      yAxis: [{ type: "value", scale: true, axisLine: { show: false }, splitLine: { lineStyle: { color: c.split } },
        axisLabel: { color: c.muted, formatter: (v) => fmtTick(v, this.interval("yAxis")) } },
      { type: "value", min: 0, max: 1, show: false }],
      dataZoom: [{ ...zoom }, { ...zoom, borderColor: c.axis, textStyle: { color: c.muted } }],
      series,
    }, { replaceMerge: ["series"] });
    this.el.dataset.drawn = "1";
    this.el.dataset.lines = String(series.length);
    this.el.dataset.members = names.join(",");
  }
}

// Whether two labels centred above their mark lines (the NaN marks') would meet: their texts' widths, NAN_LABEL_GAP_PX
// apart.
function labelsMeet(unitsPerPixel) {
  if (!measureCtx) measureCtx = document.createElement("canvas").getContext("2d");
  measureCtx.font = "10px sans-serif";
  const half = (text) => (measureCtx.measureText(text).width / 2 + NAN_LABEL_GAP_PX / 2) * unitsPerPixel;
  return (head, mark) => mark.xAxis - half(mark.text) < head.xAxis + half(head.text);
}

// Mark labels laid left to right (`marks` sorted by xAxis): one that `meets` the label before it is merged into it
// ("NaN @ 200 +2"), so none overlaps another at any zoom.
function mergeLabels(marks, meets) {
  let head = null;
  for (const mark of marks) {
    if (head && meets(head, mark)) {
      head.more += 1;
      head.text = `${head.base} +${head.more}`;
      mark.label = { show: false };
    } else {
      head = mark;
      head.base = mark.text;
      head.more = 0;
    }
  }
  for (const mark of marks) { delete mark.base; delete mark.more; }
}

// A min/max band as one custom series: polygons over the runs of points that have both bounds. Its data (each
// point's x, low and high, both on the y axis) also sets the y extent, so the band is never cut off; one item per
// point, as ECharts matches a custom series' items against its previous ones at each redraw (with two per point,
// ECharts' script time over a 1,024-rank visit and 4 zooms was 955 ms in a CPU profile; 678 ms with one).
function bandSeries(id, name, color, band) {
  const data = band.filter(([x, lo, hi]) => x !== null && lo !== null && hi !== null);
  return {
    id, name, type: "custom", data, color, silent: true, clip: true, z: 1, tooltip: { show: false },
    encode: { x: 0, y: [1, 2] },
    renderItem(params, api) {
      if (params.dataIndex !== 0) return null;
      const children = [];
      let run = [];
      const flush = () => {
        if (run.length > 1) {
          const points = run.map((p) => api.coord([p[0], p[1]])).concat(run.slice().reverse().map((p) => api.coord([p[0], p[2]])));
          children.push({ type: "polygon", shape: { points }, style: { fill: color, opacity: 0.16 } });
        }
        run = [];
      };
      for (const p of band) {
        if (p[0] === null || p[1] === null || p[2] === null) flush(); else run.push(p);
      }
      flush();
      return { type: "group", children };
    },
  };
}

// "Ignore outliers" (as TensorBoard's): the y range of the drawn lines' raw values' 5th to 95th percentile, a tenth
// wider on each side (within the data's own range), or null when there is too little to judge.
function robustRange(series, logScale) {
  const ys = [];
  for (const s of series) {
    if (!/\|(raw|line)$/.test(String(s.id))) continue;
    for (const p of s.data) if (p[1] !== null && Number.isFinite(p[1])) ys.push(p[1]);
  }
  if (ys.length < 10) return null;
  ys.sort((a, b) => a - b);
  const at = (q) => ys[Math.min(ys.length - 1, Math.floor(q * ys.length))];
  const lo = at(0.05);
  const hi = at(0.95);
  const pad = (hi - lo) * 0.1 || Math.abs(hi) * 0.1 || 1;
  const low = Math.max(ys[0], lo - pad);
  return [logScale && low <= 0 ? lo : low, Math.min(ys[ys.length - 1], hi + pad)];
}

// How many rows a tooltip lists: what fits in most of the window's height (a row is about 18 px).
function tipRows() {
  return Math.max(4, Math.min(40, Math.floor((window.innerHeight * 0.7 - 40) / 18)));
}

function tipRow(row, smoothing) {
  const el = document.createElement("div");
  el.className = "tip-row";
  el.dataset.line = row.key;
  const swatch = document.createElement("span");
  swatch.className = "tip-swatch";
  swatch.style.background = typeof row.color === "string" ? row.color : "";
  const name = document.createElement("span");
  name.className = "tip-name";
  name.textContent = row.name;
  const value = document.createElement("span");
  value.className = "tip-value";
  value.textContent = smoothing && row.smooth !== null ? fmt(row.smooth) : fmt(row.raw);
  el.append(swatch, name, value);
  if (smoothing && row.smooth !== null && row.raw !== null) {
    const raw = document.createElement("span");
    raw.className = "tip-raw";
    raw.textContent = `raw ${fmt(row.raw)}`;
    el.append(raw);
  }
  return el;
}

function samplesOf(record) {
  const consumed = num(record.consumed_samples);
  if (consumed !== null && Number.isFinite(consumed)) return consumed;
  const batch = num(record.global_batch_size);
  return batch !== null && Number.isFinite(batch) ? record.step * batch : null;
}
