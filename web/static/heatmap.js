// The step-time heatmap: one row per source (natural order; beyond HEATMAP_ROWS_MAX sources, one row per group of
// neighbouring sources showing the group's slowest), one column per bucket of logged steps, each cell the smoothed
// step time relative to the ranks' median in that column (stragglers are hot). Columns are made from the steps the
// server answered with (every column holds at least one of them), so a run logged with a stride, or with fewer
// points than columns, has no empty columns. Row labels are the part of the names that differs, cut at the left.
// Drawn by ECharts on canvas: nothing from the log becomes markup. Its ECharts instance, last answer and refresh
// time live in state.js's `state`.

import { fmt, getJSON, median, natural, num } from "./util.js";
import { state, themeColors, tracked, view } from "./state.js";

const HEATMAP_COLUMNS = 120;
const HEATMAP_POINTS_BUDGET = 40000;  // points per answer at most, shared by the sources (1,024 ranks: 39 columns)
const HEATMAP_ROWS_MAX = 32;   // more sources than this: rows of neighbouring sources, each its slowest
const ROW_PX = 12;
const LABEL_PX_MAX = 220;
export const HEATMAP_REFRESH_MS = 5000;  // app.js's render loop refreshes the heatmap at most this often

export async function refreshHeatmap() {
  state.heatmapAt = performance.now();
  // The same range as the last answer and nothing new since (a finished run), or new steps but a recent answer:
  // drawn again (the theme may have changed), not asked again. With many sources each answer is large (1,024
  // ranks: 2 MB, seconds of the server's time), so a live run's heatmap is refreshed less often.
  const shows = `${view.zoom}|${view.x}`;
  const every = HEATMAP_REFRESH_MS * Math.max(1, state.sources.size / 64);
  if (state.heatmapAnswer && state.heatmapAsked.range === shows
      && (state.heatmapAsked.seq === state.lastSeq || performance.now() - state.heatmapAsked.at < every)) {
    drawHeatmap(state.heatmapAnswer);
    return;
  }
  state.heatmapAsked = { range: shows, seq: state.lastSeq, at: performance.now() };
  const section = document.getElementById("heatmap");
  const withTimes = [...state.sources.values()].filter((s) => s.metrics.includes("step_time_ms"));
  if (withTimes.length < 2) { section.hidden = true; return; }
  section.hidden = false;
  // It lives in the Speed group (step_time_ms is there), after the charts' first rows, not above every chart.
  const speed = document.querySelector('section.group[data-group="speed"]');
  if (speed && section.parentElement !== speed) speed.insertBefore(section, speed.querySelector(".grid"));
  if (!state.heatmap) state.heatmap = echarts.init(document.getElementById("heatmap-plot"), null, { renderer: "canvas" });
  const columns = Math.max(20, Math.min(HEATMAP_COLUMNS, Math.floor(HEATMAP_POINTS_BUDGET / withTimes.length)));
  const params = new URLSearchParams({ metric: "step_time_ms", points: String(columns), smooth: "0.9" });
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
  answer.columns = columns;
  state.heatmapAnswer = answer;
  drawHeatmap(answer);
}

// Columns: the distinct steps of the answer, in order, cut into at most `max` consecutive runs (none empty).
function heatmapColumns(xs, max) {
  const steps = [...new Set(xs)].sort((a, b) => a - b);
  const cols = Math.max(1, Math.min(max, steps.length));
  const colOf = new Map();
  const last = new Array(cols).fill(null);
  steps.forEach((x, i) => {
    const col = Math.floor(i * cols / steps.length);
    colOf.set(x, col);
    last[col] = x;
  });
  return { cols, colOf, labels: last.map(String) };
}

// The part of each name that tells it from the others: the common folders in front and the common file name
// behind are dropped (cut at "/", so rank_1 and rank_12 keep "rank_").
function shortLabels(names) {
  if (names.length < 2) return names.slice();
  let prefix = names[0];
  let suffix = names[0];
  for (const n of names) {
    while (!n.startsWith(prefix)) prefix = prefix.slice(0, -1);
    while (!n.endsWith(suffix)) suffix = suffix.slice(1);
  }
  const head = prefix.lastIndexOf("/") + 1;
  const tail = suffix.includes("/") ? suffix.length - suffix.indexOf("/") : 0;
  return names.map((n) => (head + tail < n.length ? n.slice(head, n.length - tail) : n));
}

function fitLabel(ctx, text, px) {
  if (ctx.measureText(text).width <= px) return text;
  let tail = text;
  while (tail.length > 1 && ctx.measureText(`…${tail}`).width > px) tail = tail.slice(1);
  return `…${tail}`;  // the end of a name (the rank number) is what tells rows apart
}

export function drawHeatmap(answer) {
  const series = answer.series.filter((s) => !view.hidden.has(s.source));
  const sources = [...new Set(series.map((s) => s.source))].sort(natural);
  const section = document.getElementById("heatmap");
  const { cols, colOf, labels } = heatmapColumns(series.flatMap((s) => s.x), answer.columns || HEATMAP_COLUMNS);
  // rows: one per source, or per group of `per` neighbouring sources
  const per = Math.ceil(sources.length / HEATMAP_ROWS_MAX) || 1;
  const rowCount = Math.ceil(sources.length / per);
  const short = shortLabels(sources);
  const rowNames = [];
  for (let r = 0; r < rowCount; r++) {
    const a = r * per;
    const b = Math.min(sources.length, a + per) - 1;
    rowNames.push(per === 1 ? short[a] : `${short[a]} – ${short[b]}`);
  }
  const rowOf = new Map(sources.map((s, i) => [s, Math.floor(i / per)]));
  section.dataset.rows = String(sources.length);
  section.dataset.rowsDrawn = String(rowCount);
  section.dataset.columns = String(series.length ? cols : 0);
  if (!series.length || !colOf.size) return;
  // per source and column: the newest value in that column
  const values = new Map(sources.map((s) => [s, new Array(cols).fill(null)]));
  for (const s of series) {
    const row = values.get(s.source);
    for (let i = 0; i < s.x.length; i++) {
      const v = s.smooth ? s.smooth[i] : num(s.last[i]);
      if (v !== null && Number.isFinite(v)) row[colOf.get(s.x[i])] = v;
    }
  }
  const cells = new Map();  // "row,col" -> [ratio, ms, source]
  let filled = 0;
  for (let col = 0; col < cols; col++) {
    const m = median(sources.map((s) => values.get(s)[col]).filter((v) => v !== null));
    if (!m) continue;
    for (const s of sources) {
      const v = values.get(s)[col];
      if (v === null) continue;
      const key = `${rowOf.get(s)},${col}`;
      const ratio = v / m;
      const known = cells.get(key);
      if (!known || ratio > known[0]) cells.set(key, [ratio, v, s]);
    }
  }
  const data = [];
  for (const [key, [ratio, ms, source]] of cells) {
    const [row, col] = key.split(",").map(Number);
    data.push([col, rowCount - 1 - row, Number(ratio.toFixed(3)), ms, source]);
    filled += 1;
  }
  const c = themeColors();
  const ctx = document.createElement("canvas").getContext("2d");
  ctx.font = "11px sans-serif";
  const labelPx = Math.min(LABEL_PX_MAX, Math.max(40, ...rowNames.map((n) => ctx.measureText(n).width)));
  const yLabels = rowNames.map((n) => fitLabel(ctx, n, labelPx)).reverse();  // first source on top
  const plot = document.getElementById("heatmap-plot");
  const height = Math.max(140, rowCount * ROW_PX + 40);
  if (plot.clientHeight !== height) { plot.style.height = `${height}px`; state.heatmap.resize(); }
  const what = per === 1 ? "" : ` (rows of ${per} sources: each the slowest of them)`;
  state.heatmap.setOption({
    animation: false,
    backgroundColor: "transparent",
    grid: { left: Math.ceil(labelPx) + 14, right: 70, top: 8, bottom: 28 },
    tooltip: { renderMode: "richText", backgroundColor: c.tooltip, textStyle: { color: c.text },
      formatter: (p) => `${p.value[4]} · steps to ${labels[p.value[0]]}\n${fmt(Number(p.value[3].toFixed(1)))} ms (${p.value[2]}× the ranks' median)` },
    xAxis: { type: "category", data: labels, axisLabel: { color: c.muted, hideOverlap: true }, axisLine: { lineStyle: { color: c.axis } } },
    yAxis: { type: "category", data: yLabels, axisLabel: { color: c.text, fontSize: 11, interval: 0 },
      axisTick: { show: false }, axisLine: { lineStyle: { color: c.axis } } },
    visualMap: { min: 0.9, max: 1.3, calculable: false, orient: "vertical", right: 4, top: 8, itemHeight: 100, itemWidth: 10,
      dimension: 2, text: ["slow", "fast"], textStyle: { color: c.muted }, inRange: { color: ["#2ea121", "#c9e265", "#f5c400", "#ff8800", "#d83931"] } },
    series: [{ type: "heatmap", data, progressive: 0, emphasis: { disabled: true } }],
  }, { notMerge: true });
  section.querySelector(".heatmap-what").textContent = what;
  section.dataset.cells = String(filled);
  section.dataset.labels = yLabels.join("\n");
  // columns with no cell at all (there should be none: every column holds a step some source logged)
  const used = new Set(data.map((d) => d[0]));
  section.dataset.emptyColumns = String(cols - used.size);
}
