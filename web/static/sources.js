// The header strip: one card per source (step, loss, lr, step time, ETA, throughput, time since its last step,
// the follower's counters), the baseline select's choices, and showing / hiding a source on every chart.
// It keeps the per-source facts the cards show up to date from the stream's records (noteRecord).
// Everything from log text or paths is set with textContent: never HTML.

import { fmt, fmtAxis, fmtDuration, getJSON, median, num } from "./util.js";
import { colorOf, state, view, writeURL } from "./state.js";
import { drawHeatmap } from "./heatmap.js";

const STEP_TIMES_KEPT = 50;       // the header's step time is the median of this many latest steps

let scheduleRender = null;        // app.js's render loop, passed to setupSources
let sourcesFetch = null;          // the /api/sources request in flight (refreshSources), if any

export function setupSources(hooks) {
  ({ scheduleRender } = hooks);
}

// ---- sources: show / hide ---------------------------------------------------------------------------------
export function setHidden(source, hidden) {
  if (hidden) view.hidden.add(source); else view.hidden.delete(source);
  writeURL();
  for (const chart of state.charts.values()) chart.dirty = true;
  scheduleRender();
  if (state.heatmapAnswer) drawHeatmap(state.heatmapAnswer);
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

export function renderSources() {
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

export function noteRecord(record) {
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
  if (sourcesFetch) return;
  sourcesFetch = getJSON("/api/sources").then((list) => {
    for (const info of list) if (!state.sources.has(info.id)) state.sources.set(info.id, info);
    scheduleRender();
  }).catch((err) => console.warn("sources unavailable", err)).finally(() => { sourcesFetch = null; });
}

export async function loadRecentStepTimes(sources) {
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
