// The step-time heatmap: one row per source (natural order; beyond HEATMAP_ROWS_MAX sources, one row per group of
// neighbouring sources showing the group's slowest), one column per run of consecutive logged steps, each cell the
// source's mean step time in the column relative to the ranks' median there (stragglers are hot). The server computes
// the matrix (`/api/heatmap`, mstail.tailer.history.heatmap): one small answer whatever the number of ranks. Every column
// holds a step some source logged, so a run logged with a stride, or with fewer points than columns, has no empty
// columns. Row labels are the part of the names that differs, cut at the left.
// Drawn by ECharts on canvas: nothing from the log becomes markup. Its ECharts instance, last answer and refresh
// time live in state.js's `state`.

import { fmt, getJSON } from "./util.js";
import { state, themeColors, tracked, view } from "./state.js";

const HEATMAP_COLUMNS = 120;
const ON_SCREEN = "100px 0px";  // its answer is dear: asked only when (about) on screen
const HEATMAP_ROWS_MAX = 32;   // more sources than this: rows of neighbouring sources, each its slowest
const ROW_PX = 12;
const LABEL_PX_MAX = 220;
export const HEATMAP_REFRESH_MS = 5000;  // app.js's render loop refreshes the heatmap at most this often

// Whether the heatmap is on the screen (an IntersectionObserver, from its first drawing), and whether a lazy
// refresh passed it over while it was not: it is asked again when it comes on screen.
const near = { now: true, missed: false, observer: null };

function watchNearScreen(section) {
  if (near.observer) return;
  near.observer = new IntersectionObserver((entries) => {
    near.now = entries[entries.length - 1].isIntersecting;
    if (near.now && near.missed) { near.missed = false; refreshHeatmap(); }
  }, { rootMargin: ON_SCREEN });
  near.observer.observe(section);
}

// `lazy` (a zoom, the render loop's refresh): not asked while the heatmap is off the screen (its answer costs
// the server a pass over every rank's points, 0.5 s at 1,024 ranks, which the charts' answers would wait behind).
export async function refreshHeatmap(lazy = false) {
  if (lazy && state.heatmap && !near.now) { near.missed = true; return; }
  state.heatmapAt = performance.now();
  // The same range and sources as the last answer and nothing new since (a finished run), or new steps but a
  // recent answer: drawn again (the theme may have changed), not asked again.
  const shows = `${view.zoom}|${view.x}|${[...view.hidden].sort()}`;
  if (state.heatmapAnswer && state.heatmapAsked.range === shows
      && (state.heatmapAsked.seq === state.lastSeq || performance.now() - state.heatmapAsked.at < HEATMAP_REFRESH_MS)) {
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
  const params = new URLSearchParams({ metric: "step_time_ms", columns: String(HEATMAP_COLUMNS), rows: String(HEATMAP_ROWS_MAX) });
  for (const id of view.hidden) params.append("exclude", id);
  const loss = state.charts.get("step_time_ms") || state.charts.get("loss");
  const range = view.zoom && loss ? loss.stepsOf(view.zoom) : null;
  if (range) { params.set("start", String(range[0])); params.set("end", String(range[1])); }
  let answer;
  try {
    answer = await tracked(getJSON(`/api/heatmap?${params}`));
  } catch (err) {
    console.warn("heatmap unavailable", err);
    return;
  }
  state.heatmapAnswer = answer;
  drawHeatmap(answer);
  watchNearScreen(section);
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
  const section = document.getElementById("heatmap");
  const { ids, per, columns } = answer;
  const rowCount = answer.ratio.length;
  const short = shortLabels(ids);
  const rowNames = [];
  for (let r = 0; r < rowCount; r++) {
    const a = r * per;
    const b = Math.min(ids.length, a + per) - 1;
    rowNames.push(per === 1 ? short[a] : `${short[a]} – ${short[b]}`);
  }
  const labels = columns.map(String);
  section.dataset.rows = String(ids.length);
  section.dataset.rowsDrawn = String(rowCount);
  section.dataset.columns = String(columns.length);
  if (!columns.length) return;
  const data = [];  // [column, row from the bottom, ratio, mean, source]
  answer.ratio.forEach((row, r) => row.forEach((ratio, col) => {
    if (ratio !== null) data.push([col, rowCount - 1 - r, ratio, answer.value[r][col], ids[answer.source[r][col]]]);
  }));
  const filled = data.length;
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
    // The scale and its two words ("slow" above, "fast" below) inside the plot, whatever its height.
    visualMap: { min: 0.9, max: 1.3, calculable: false, orient: "vertical", right: 14, top: 6, itemWidth: 10,
      itemHeight: Math.max(40, Math.min(100, height - 6 - 2 * 20)), textGap: 4,
      dimension: 2, text: ["slow", "fast"], textStyle: { color: c.muted }, inRange: { color: ["#2ea121", "#c9e265", "#f5c400", "#ff8800", "#d83931"] } },
    series: [{ type: "heatmap", data, progressive: 0, emphasis: { disabled: true } }],
  }, { notMerge: true });
  section.querySelector(".heatmap-what").textContent = what;
  section.dataset.cells = String(filled);
  section.dataset.labels = yLabels.join("\n");
  // columns with no cell at all (there should be none: every column holds a step some source logged)
  const used = new Set(data.map((d) => d[0]));
  section.dataset.emptyColumns = String(columns.length - used.size);
}
