// The step-time heatmap: one row per source, one column per step bucket, each cell the source's smoothed step time
// relative to the ranks' median in that column (stragglers are hot). Drawn by ECharts on canvas: nothing from the
// log becomes markup. Its ECharts instance, last answer and refresh time live in state.js's `state`.

import { fmt, getJSON, median, num } from "./util.js";
import { state, themeColors, tracked, view } from "./state.js";

const HEATMAP_COLUMNS = 120;
export const HEATMAP_REFRESH_MS = 5000;  // app.js's render loop refreshes the heatmap at most this often

export async function refreshHeatmap() {
  state.heatmapAt = performance.now();
  const section = document.getElementById("heatmap");
  const withTimes = [...state.sources.values()].filter((s) => s.metrics.includes("step_time_ms"));
  if (withTimes.length < 2) { section.hidden = true; return; }
  section.hidden = false;
  if (!state.heatmap) state.heatmap = echarts.init(document.getElementById("heatmap-plot"), null, { renderer: "canvas" });
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
  state.heatmapAnswer = answer;
  drawHeatmap(answer);
}

export function drawHeatmap(answer) {
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
  state.heatmap.setOption({
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
