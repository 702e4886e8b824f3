// The sources: one card per source up to CARDS_MAX sources, beyond that a compact table (filter by name, sort by
// lag / step time / loss, the worst few highlighted) so the charts still start on the first screen. Each shows the
// source's state in words and colour (following, idle, finished, died, stopped, crashed, hung, unreadable,
// unreachable, no format: hang colours only while the alert engine has a hang alert firing for it), step, loss, lr,
// step time, ETA, throughput and time since its last step; the file-reading counters sit behind the "file details"
// disclosure. It keeps the per-source facts up to date from the stream: its records (noteRecord) and its `source`
// messages (noteSource: the server sends a source's entry, counters included, when it changes, at most a few times
// a second); /api/sources is
// asked again only after a reconnect or for a source the page has not met. The baseline select's choices and showing
// / hiding a source live here too.
// Everything from log text or paths is set with textContent: never HTML.

import { fmt, fmtAxis, fmtDuration, getJSON, median, natural, num } from "./util.js";
import { CARDS_MAX, MANY_LINES, colorOf, comparingRuns, offChart, sourceMatcher, state, view, writeURL } from "./state.js";
import { refreshHeatmap } from "./heatmap.js";

const STEP_TIMES_KEPT = 50;       // the header's step time is the median of this many latest steps
const TABLE_ROWS_MAX = 200;       // rows drawn in the table (sorted and filtered first; the rest are counted)
const WORST_KEPT = 3;             // sources highlighted as the worst (and drawn on top of the mean + band)
const IDLE_AFTER_S = 300;         // no step for this long (or 10 step times, if longer): idle, not following
const EXPLAIN_HINT = "try `mstail parse FILE --explain` to see what each line matched, or `--pattern` / a format file "
  + "for a log format mstail does not know";

let scheduleRender = null;        // app.js's render loop, passed to setupSources
let sourcesFetch = null;          // the /api/sources request in flight, if any

export function setupSources(hooks) {
  ({ scheduleRender } = hooks);
  const filter = document.getElementById("source-filter");
  filter.value = view.sourceFilter;
  // The charts follow the filter (their lines, and the server's mean of the matching sources) once typing pauses.
  let timer = null;
  filter.addEventListener("input", () => {
    view.sourceFilter = filter.value;
    writeURL();
    renderSources();
    clearTimeout(timer);
    timer = setTimeout(() => redrawAll(), 200);  // (the heatmap keeps every rank: it is where stragglers show)
  });
  const sort = document.getElementById("source-sort");
  sort.value = view.sourceSort;
  sort.addEventListener("change", () => { view.sourceSort = sort.value; writeURL(); renderSources(); });
  const details = document.getElementById("file-details");
  details.addEventListener("click", () => {
    view.details = !view.details;
    details.setAttribute("aria-expanded", String(view.details));
    renderSources();
    if (view.details) pollSources();
  });
  // One listener for every card's and row's buttons (the strip is rebuilt every second; 1,024 ranks: 400 buttons).
  document.getElementById("sources").addEventListener("click", (event) => {
    const button = event.target.closest("button.toggle, button.pin");
    const source = button && button.closest("[data-source]");
    if (!source) return;
    const id = source.dataset.source;
    if (button.classList.contains("pin")) setPicked(id, !view.pick.has(id));
    else setHidden(id, !view.hidden.has(id));
  });
}

// ---- sources: show / hide, pick ---------------------------------------------------------------------------
export function setHidden(source, hidden) {
  if (hidden) view.hidden.add(source); else view.hidden.delete(source);
  redrawAll();
  if (state.heatmapAnswer) refreshHeatmap();  // asked again without the hidden sources
}

// A run's heading shows or hides all of its sources at once (all shown unless every one is hidden now).
function setRunHidden(run) {
  const ids = [...state.sources.values()].filter((i) => i.run === run).map((i) => i.id);
  const hide = !ids.every((id) => view.hidden.has(id));
  for (const id of ids) if (hide) view.hidden.add(id); else view.hidden.delete(id);
  redrawAll();
  if (state.heatmapAnswer) refreshHeatmap();  // asked again without the hidden sources
}

function runHeading(run, infos) {
  const head = el("button", "run-heading");
  head.type = "button";
  head.dataset.run = run;
  head.title = "click: show or hide every source of this run";
  const shown = infos.filter((i) => !view.hidden.has(i.id)).length;
  head.setAttribute("aria-pressed", String(shown > 0));
  const swatch = el("span", "swatch");
  swatch.style.background = colorOf(infos[0].id);
  head.append(swatch, el("span", "id", run), el("span", "muted", ` ${shown} of ${infos.length} shown`));
  head.addEventListener("click", () => setRunHidden(run));
  return head;
}

// With several runs, each run's entries follow its heading (in the order given, a name sort keeps runs together).
function groupedByRun(entries, render) {
  if (!comparingRuns()) return entries.flatMap(render);
  const runs = new Map();
  for (const e of entries) {
    const run = e.info.run || "";
    if (!runs.has(run)) runs.set(run, []);
    runs.get(run).push(e);
  }
  return [...runs].flatMap(([run, group]) => [
    ...(run ? [runHeading(run, group.map((e) => e.info))] : []), ...group.flatMap(render)]);
}

function setPicked(source, picked) {
  if (picked) view.pick.add(source); else view.pick.delete(source);
  redrawAll();
}

function redrawAll() {
  writeURL();
  for (const chart of state.charts.values()) chart.dirty = true;
  scheduleRender();
  renderSources();
}

// ---- what a source is doing -----------------------------------------------------------------------------
function hangAlert(id) {
  for (const alert of state.alerts.values()) {
    if (alert.rule === "hang" && alert.source === id && alert.state === "firing") return alert;
  }
  return null;
}

// How a run ended, as the server judged it (tailer/alerts/fate.py): the reason goes in the state's tooltip, and a fate
// the silence alone decided (writers on a network filesystem are not seen) is shown as a guess ("died?").
const FATES = { finished: "done", died: "bad", stopped: "muted" };

// One word and a colour class per source. Red only for what needs someone: a firing hang alert, a run that died or
// crashed, a file mstail cannot read. A run that stopped without saying whether it finished is "stopped", never done.
export function sourceStatus(info) {
  if (info.state === "unreadable") return { key: "unreadable", text: "unreadable", level: "bad" };
  // a node mstail a central one follows (--peer), out of reach: since when is in its problem
  if (info.state === "unreachable") {
    return { key: "unreachable", text: "unreachable", level: "bad", why: info.problem || "" };
  }
  if (hangAlert(info.id)) return { key: "hung", text: "hung", level: "bad" };
  if (FATES[info.state]) {
    const text = info.state + (info.end_guessed ? "?" : "");
    return { key: info.state, text, level: FATES[info.state], why: info.end_reason || "" };
  }
  const life = state.lifecycle.get(info.id);
  if (life && life.kind === "error" && !(typeof life.step === "number" && info.last_step > life.step)) {
    return { key: "crashed", text: "crashed", level: "bad" };
  }
  if (info.state === "waiting" && info.problem) return { key: "missing", text: "missing", level: "warn" };  // a --log typo
  if (!info.format && info.problem) return { key: "noformat", text: "no format", level: "warn" };
  // following: the file is followed and its last step is recent (an old run read at start is idle, not live)
  const since = typeof info.last_time === "number" ? Date.now() / 1000 - info.last_time : null;
  const stepMs = median(state.recentStepMs.get(info.id) || []);
  const recent = since === null || since < Math.max(IDLE_AFTER_S, 10 * (stepMs || 0) / 1000);
  if (info.state === "following" && info.records && recent) return { key: "following", text: "following", level: "ok" };
  if (info.state === "gone") return { key: "gone", text: "gone", level: "muted" };
  if (!info.records) return { key: "waiting", text: info.format ? "waiting for steps" : "waiting", level: "muted" };
  return { key: "idle", text: "idle", level: "muted" };
}

function latestOf(metric, source) {
  const chart = state.charts.get(metric);
  return chart ? chart.latest.get(source) : undefined;
}

// The facts of one source, as [label, text, class] rows, plus what sorting and ranking need.
function factsOf(info, now, maxStep) {
  const status = sourceStatus(info);
  const stepMs = median(state.recentStepMs.get(info.id) || []);
  const total = info.total_steps ? ` / ${info.total_steps}` : "";
  const left = info.total_steps && info.last_step !== null ? info.total_steps - info.last_step : null;
  const running = status.key === "following" || status.key === "hung";
  // "done" only for a run that finished (its end logged, or its last step the total), never for one that stopped
  const eta = status.key === "finished" ? (info.end_guessed ? "done?" : "done") : status.key === "died" ? "died"
    : status.key === "stopped" || status.key === "crashed" ? "stopped"
    : running && left !== null && stepMs !== null ? fmtDuration(left * stepMs / 1000) : "–";
  const tflops = latestOf("throughput_tflops", info.id);
  const sps = latestOf("samples_per_s", info.id);
  const since = typeof info.last_time === "number" ? Math.max(0, now - info.last_time) : null;
  // amber: a following run slower than usual to log its next step; red: a hang alert is firing
  const amberS = Math.max(15, Math.max(60, 10 * (stepMs || 0) / 1000) / 3);
  const level = status.key === "hung" ? "red" : status.key === "following" && since !== null && since >= amberS ? "amber" : "none";
  const lag = maxStep !== null && info.last_step !== null ? maxStep - info.last_step : null;
  const loss = latestOf("loss", info.id);
  return {
    status, stepMs, lag, loss: num(loss), level,
    rows: [
      ["step", info.last_step === null ? "–" : `${info.last_step}${total}`, "step"],
      ["loss", fmt(loss), "loss"],
      ["lr", fmt(latestOf("lr", info.id)), "lr"],
      ["step time", stepMs === null ? "–" : `${fmt(Math.round(stepMs))} ms`, "steptime"],
      ["ETA", eta, "eta"],
      ["throughput", tflops !== undefined ? `${fmt(tflops)} TFLOPS` : sps !== undefined ? `${fmt(sps)} samples/s` : "–", "throughput"],
      ["since last step", since === null ? "–" : fmtDuration(since), `since ${level}`],
    ],
  };
}

function countersText(info) {
  const c = info.counters || {};
  const parts = [["lines", c.lines], ["bytes", c.bytes], ["records", info.records], ["unmatched", c.unmatched_metric_lines],
    ["field errors", c.field_errors], ["slow", c.slow_lines], ["cut", c.cut_lines], ["bad utf-8", c.bad_utf8_lines],
    ["truncations", c.truncations], ["rotations", c.rotations], ["failures", c.failures], ["unplottable", c.unplottable]];
  const counts = parts.filter((p) => p[1] !== undefined).map(([k, v]) => `${k} ${k === "bytes" ? fmtAxis(v) : v}`);
  // Which rule judges a silence (tailer/live/sidecar.py): the writer seen on this machine, or the time bound alone.
  if (info.hang_rule === "writer") counts.push("hang: judged by its writer (silent and not written: over)");
  if (info.hang_rule === "time bound") counts.push("hang: time bound only (network filesystem: writers not seen)");
  return counts.join(" · ");
}

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

function toggleButton(info) {
  const head = el("button", "toggle");
  head.type = "button";
  head.title = `${info.path}\nclick: show or hide this source on every chart`;
  head.setAttribute("aria-pressed", String(!view.hidden.has(info.id)));
  const swatch = el("span", "swatch");
  swatch.style.background = colorOf(info.id);
  head.append(swatch, el("span", "id", info.id));
  return head;
}

function statusEl(info, status) {
  const st = el("span", `state ${status.key} level-${status.level}`, status.text + (info.format ? ` · ${info.format}` : ""));
  st.dataset.state = status.key;
  if (status.why) st.title = status.why;
  return st;
}

function problemEl(info) {
  // what mstail cannot do with this file, and what to try (from the server, as text)
  return el("div", "problem", info.problem);
}

// ---- cards (a few sources) --------------------------------------------------------------------------------
function card(info, facts) {
  const node = el("div", "source card");
  node.dataset.source = info.id;
  node.dataset.state = facts.status.key;
  node.classList.toggle("hidden-source", view.hidden.has(info.id));
  node.append(toggleButton(info), statusEl(info, facts.status));
  const list = el("div", "facts");
  for (const [label, text, cls] of facts.rows) {
    const item = el("span", `fact ${cls}`);
    item.append(el("span", "label", label), el("span", "value", text));
    if (cls.startsWith("since")) item.dataset.level = facts.level;
    list.append(item);
  }
  node.append(list);
  if (view.details) node.append(el("div", "counters", countersText(info)));
  if (info.problem) node.append(problemEl(info));
  if (facts.status.why) node.append(el("div", "ending", facts.status.why));  // how its run ended, in words
  return node;
}

// ---- table (many sources) ---------------------------------------------------------------------------------
const TABLE_COLUMNS = ["source", "state", "step", "lag", "loss", "step time", "ETA", "since last step"];

function tableRow(info, facts, worst) {
  const row = el("tr", "source row");
  row.dataset.source = info.id;
  row.dataset.state = facts.status.key;
  row.classList.toggle("hidden-source", view.hidden.has(info.id));
  row.classList.toggle("worst", worst);
  const name = el("td", "name");
  const pin = el("button", "pin", "★");
  pin.type = "button";
  pin.title = "draw this source on top of the mean + band";
  pin.setAttribute("aria-pressed", String(view.pick.has(info.id)));
  name.append(pin, toggleButton(info));
  const status = el("td");
  status.append(statusEl(info, facts.status));
  const by = Object.fromEntries(facts.rows.map((r) => [r[2].split(" ")[0], r[1]]));
  const since = el("td", `since ${facts.level}`, by.since);
  since.dataset.level = facts.level;
  row.append(name, status, el("td", "num step", by.step), el("td", "num lag", facts.lag === null ? "–" : String(facts.lag)),
    el("td", "num loss", by.loss), el("td", "num steptime", by.steptime), el("td", "num eta", by.eta), since);
  const rows = [row];
  if (view.details || info.problem) {
    const extra = el("tr", "source-extra");
    const cell = el("td");
    cell.colSpan = TABLE_COLUMNS.length;
    if (view.details) cell.append(el("div", "counters", countersText(info)));
    if (info.problem) cell.append(problemEl(info));
    extra.append(cell);
    rows.push(extra);
  }
  return rows;
}

function runRow(heading) {
  const row = el("tr", "run-row");
  const cell = el("td");
  cell.colSpan = TABLE_COLUMNS.length;
  cell.append(heading);
  row.append(cell);
  return row;
}

const SORTS = {
  name: (a, b) => natural(a.info.id, b.info.id),
  lag: (a, b) => (b.facts.lag ?? -1) - (a.facts.lag ?? -1) || natural(a.info.id, b.info.id),
  steptime: (a, b) => (b.facts.stepMs ?? -1) - (a.facts.stepMs ?? -1) || natural(a.info.id, b.info.id),
  loss: (a, b) => (Number.isFinite(b.facts.loss) ? b.facts.loss : -Infinity) - (Number.isFinite(a.facts.loss) ? a.facts.loss : -Infinity)
    || natural(a.info.id, b.info.id),
};

// The worst few: hung or crashed first, then the farthest behind, then the slowest (only when clearly behind or
// slower than the others: a healthy run highlights nobody).
function rankWorst(entries) {
  const times = entries.map((e) => e.facts.stepMs).filter((v) => v !== null);
  const typical = median(times);
  const score = (e) => {
    if (e.facts.status.level === "bad") return 1e12;
    const lag = e.facts.lag || 0;
    const slow = typical && e.facts.stepMs !== null ? e.facts.stepMs / typical - 1 : 0;
    return lag > 0 || slow > 0.1 ? lag * 1000 + Math.max(0, slow) * 1000 : 0;
  };
  return entries.map((e) => [score(e), e.info.id]).filter(([s]) => s > 0).sort((a, b) => b[0] - a[0])
    .slice(0, WORST_KEPT).map(([, id]) => id);
}

// ---- the strip ------------------------------------------------------------------------------------------
export function renderSources() {
  const strip = document.getElementById("sources");
  const now = Date.now() / 1000;
  const infos = [...state.sources.values()];
  let maxStep = null;
  for (const info of infos) if (info.last_step !== null && !(maxStep >= info.last_step)) maxStep = info.last_step;
  const entries = infos.map((info) => ({ info, facts: factsOf(info, now, maxStep) }));
  const worst = rankWorst(entries.filter((e) => !offChart(e.info.id)));
  const changed = String(worst) !== String([...state.worst]);
  state.worst = new Set(worst);
  if (changed) for (const chart of state.charts.values()) chart.dirty = true;
  const many = infos.length > CARDS_MAX;
  const panel = document.getElementById("sources-panel");
  panel.dataset.layout = many ? "table" : "cards";
  document.getElementById("source-filter").hidden = !many;
  document.getElementById("source-sort-label").hidden = !many;
  if (!many) {
    strip.replaceChildren(...groupedByRun(entries.sort(SORTS.name), (e) => [card(e.info, e.facts)]));
  } else {
    const match = sourceMatcher();  // a regex, as the chart filter; an invalid one is said on the box
    const filterBox = document.getElementById("source-filter");
    filterBox.classList.toggle("invalid", !!match.problem);
    filterBox.title = match.problem || "show only the sources whose name matches this regular expression";
    const shown = entries.filter((e) => match.test(e.info.id)).sort(SORTS[view.sourceSort] || SORTS.name);
    const table = el("table", "source-table");
    const head = el("tr");
    for (const name of TABLE_COLUMNS) head.append(el("th", undefined, name));
    const thead = el("thead");
    thead.append(head);
    const body = el("tbody");
    const worstSet = new Set(worst);
    const listed = shown.slice(0, TABLE_ROWS_MAX);
    const rows = groupedByRun(listed, (e) => tableRow(e.info, e.facts, worstSet.has(e.info.id)));
    body.append(...rows.map((row) => (row.tagName === "TR" ? row : runRow(row))));
    table.append(thead, body);
    const more = shown.length - Math.min(shown.length, TABLE_ROWS_MAX);
    const note = el("p", "muted table-note",
      `${shown.length} of ${infos.length} sources${more ? ` (${more} more not listed: filter or sort to see them)` : ""}`);
    // The same scrolling box each time, so it keeps its scroll position without reading it (a read lays out
    // the page: a fifth of the first paint's script time at 1,024 ranks).
    let wrap = strip.querySelector(".table-scroll");
    if (!wrap) strip.replaceChildren(wrap = el("div", "table-scroll"), note);
    else strip.lastChild.replaceWith(note);
    wrap.replaceChildren(table);
  }
  const summary = `${infos.length} source${infos.length === 1 ? "" : "s"}` + (view.details ? ` · seq ${state.lastSeq}` : "");
  document.getElementById("summary").textContent = summary;
  renderEmpty(infos);
  renderBaselineChoices();
  const shown = infos.filter((i) => !offChart(i.id)).length;
  const auto = comparingRuns() ? "compare runs" : shown > MANY_LINES ? "mean + band" : "overlay";
  document.querySelector("#ranks option[value='auto']").textContent = `auto (${auto})`;
}

// No chart yet: say which files mstail has found (or that it has found none), what each is doing, and what to try.
function renderEmpty(infos) {
  const empty = document.getElementById("empty");
  if (state.charts.size) { empty.hidden = true; return; }
  empty.hidden = false;
  const lines = [];
  if (!infos.length && state.waitingForRuns.length) {
    lines.push(`No run found yet below ${state.waitingForRuns.join(", ")}: mstail follows each run as soon as its `
      + "output/log/rank_N/info.log, msrun worker_N.log, mstail.callback *.jsonl, event files or a text log it recognises appear.");
  } else if (!infos.length) {
    lines.push("No log file found yet. mstail shows curves as soon as a file matching --log (or --jsonl) appears and "
      + "logs step lines.");
  } else {
    lines.push(`No step lines yet in ${infos.length === 1 ? "the file" : `the ${infos.length} files`} mstail follows:`);
    for (const info of infos.slice(0, 20)) {
      const why = info.problem ? ` — ${info.problem}` : info.format ? ` — format ${info.format}, waiting for its step lines`
        : " — no known format recognised yet";
      lines.push(`${info.path} (${sourceStatus(info).text})${why}`);
    }
    if (infos.length > 20) lines.push(`… and ${infos.length - 20} more`);
    lines.push(`Nothing after a while? ${EXPLAIN_HINT}.`);
  }
  empty.replaceChildren(...lines.map((text, i) => el(i ? "span" : "strong", "empty-line", text)));
}

function renderBaselineChoices() {
  const select = document.getElementById("baseline");
  const ids = [...state.sources.keys()].sort(natural);
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

// ---- keeping the facts current --------------------------------------------------------------------------
export function noteRecord(record) {
  const info = state.sources.get(record.source);
  if (!info) { pollSources(); return; }
  if (info.first_step === null) info.first_step = record.step;
  if (!(info.last_step > record.step)) info.last_step = record.step;
  if (typeof record.time === "number" && !(info.last_time > record.time)) info.last_time = record.time;
  if (!state.firstTime.has(record.source) && typeof record.time === "number") state.firstTime.set(record.source, record.time);
  const ms = num(record.step_time_ms);
  if (ms !== null && Number.isFinite(ms)) {
    const recent = state.recentStepMs.get(record.source) || [];
    recent.push(ms);
    if (recent.length > STEP_TIMES_KEPT) recent.shift();
    state.recentStepMs.set(record.source, recent);
  }
}

// A source's entry from the server (the stream's `source` message or /api/sources): the server's counters and
// state win; the newest step the page saw wins if the server's answer is older than the stream.
export function noteSource(fresh) {
  const known = state.sources.get(fresh.id);
  if (known) {
    if (known.last_step !== null && !(fresh.last_step >= known.last_step)) fresh.last_step = known.last_step;
    if (typeof known.last_time === "number" && !(fresh.last_time >= known.last_time)) fresh.last_time = known.last_time;
  }
  state.sources.set(fresh.id, fresh);
  if (fresh.run && !state.runs.has(fresh.run)) {
    state.runs.add(fresh.run);
    if (state.runs.size === 2) for (const chart of state.charts.values()) chart.dirty = true;  // colours by run now
  }
  colorOf(fresh.id);
}

// Every source as the page needs it first: /api/sources?compact=true, a table without the file-reading counters
// (1,024 ranks: a fifth of the size), as /api/sources entries with empty counters. "file details" asks for those.
export async function fetchSources() {
  const table = await getJSON("/api/sources?compact=true");
  return table.rows.map((row) => {
    const info = { counters: {} };
    table.keys.forEach((key, i) => { info[key] = row[i]; });
    info.metrics = info.metrics.map((m) => table.metrics[m]);
    return info;
  });
}

// Every source's entry again: after the stream reconnects (the `source` messages sent meanwhile are not replayed)
// or when a record names a source the page has not met.
export function pollSources() {
  if (sourcesFetch) return;
  sourcesFetch = getJSON("/api/sources").then((list) => {
    const added = list.filter((info) => !state.sources.has(info.id)).map((info) => info.id).sort(natural);
    for (const id of added) colorOf(id);
    for (const info of list) noteSource(info);
    renderSources();
    if (added.length) scheduleRender();
  }).catch((err) => console.warn("sources unavailable", err)).finally(() => { sourcesFetch = null; });
}

export async function loadRecentStepTimes(sources) {
  const lasts = sources.map((s) => s.last_step).filter((s) => s !== null);
  if (!lasts.length || !sources.some((s) => s.metrics.includes("step_time_ms"))) return;
  const start = Math.min(...lasts) - STEP_TIMES_KEPT;  // the newest steps only (1,024 ranks: 51,200 points)
  const answer = await getJSON(`/api/series?metric=step_time_ms&start=${start}&points=20000`);
  for (const s of answer.series) {
    const values = s.last.map(num).filter((v) => v !== null && Number.isFinite(v));
    const recent = (state.recentStepMs.get(s.source) || []).concat(values).slice(-STEP_TIMES_KEPT);
    state.recentStepMs.set(s.source, recent);
  }
}
