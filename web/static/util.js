// Small helpers shared by the page's modules. Nothing here touches the DOM with markup: text only.

// The record's definition, parsers/record.schema.json (the app serves it beside these files; index.html preloads
// it): read before any module of the page runs, so no record is ever drawn without it. A plain fetch, not getJSON:
// its "no-store" would pass the preloaded answer by.
const RECORD_SCHEMA = await (async () => {
  const response = await fetch("/static/record.schema.json");
  if (!response.ok) throw new Error(`/static/record.schema.json: HTTP ${response.status}`);
  return response.json();
})();
// The keys of a record or an event that are never metrics (seq, source, step, time, kind, ...).
export const RESERVED = new Set(Object.keys(RECORD_SCHEMA.$defs.reserved.properties));

// 16 colours far apart in hue and lightness (readable on both themes); sources beyond them get hues spaced by the
// golden angle (colorAt), so no two lines drawn together share a colour.
export const PALETTE = ["#3370ff", "#f54a45", "#2ea121", "#ff8800", "#7f3bf5", "#14c0ff", "#c9a800", "#a23b72",
  "#2a9d8f", "#e76f51", "#5b6b7f", "#8ab17d", "#0b5cad", "#d4489b", "#6b4226", "#00a37a"];

export function colorAt(index) {
  if (index < PALETTE.length) return PALETTE[index];
  const hue = Math.round((index * 137.508) % 360);
  return `hsl(${hue}, ${62 + (index % 3) * 10}%, ${42 + (index % 4) * 6}%)`;
}

// Natural order: rank_2 before rank_10 (numbers compared as numbers), for cards, legends and heatmap rows.
const COLLATOR = new Intl.Collator(undefined, { numeric: true, sensitivity: "base" });
export const natural = (a, b) => COLLATOR.compare(a, b) || (a < b ? -1 : a > b ? 1 : 0);

// Schedules, flags, counters and step indices are drawn as logged: an EMA would draw overflow as 0.42, a loss-scale
// drop as a slow ramp, and make lr lag its own schedule. Each chart can still flip its default (view.flip).
const UNSMOOTHED = [
  /(^|[_.])lr$/, /learning_rate/, /loss_scale|scale_sense/, /overflow|skipped|(^|_)is_|_flag$/,
  /(^|_)(steps?|epochs?|iters?|iterations?)(_(idx|index|num|no))?$/,
  /^consumed_|(^|_)counts?$|^num_|_total$|batch_size$/,
];
export function smoothByDefault(metric) {
  return !UNSMOOTHED.some((re) => re.test(metric));
}

export const GROUPS = [
  ["loss", "Losses"],
  ["optim", "Optimisation"],
  ["speed", "Speed"],
  ["eval", "Evaluation"],
  ["other", "Other"],
];

export function metricGroup(metric) {
  if (metric.startsWith("eval_")) return "eval";
  if ((/loss/.test(metric) && metric !== "loss_scale") || /(^|_)perplexity$/.test(metric)) return "loss";  // perplexity: exp(loss)
  if (/^(lr|grad_norm|global_norm|loss_scale|overflow)$/.test(metric) || /(^|_)lr$/.test(metric)) return "optim";
  if (/(time|throughput|samples|tflops|tokens)/.test(metric)) return "speed";
  return "other";
}

export function num(value) {
  // Non-finite values travel as strings ("NaN", "Infinity", "-Infinity"); null means "no value".
  if (typeof value === "number") return value;
  if (typeof value === "boolean") return value ? 1 : 0;
  if (value === "NaN") return NaN;
  if (value === "Infinity") return Infinity;
  if (value === "-Infinity") return -Infinity;
  return null;
}

export function fmt(value) {
  if (value === null || value === undefined) return "–";
  if (typeof value === "string") return value;  // "NaN", "Infinity"
  if (typeof value === "boolean") return value ? "1" : "0";
  if (!Number.isFinite(value)) return String(value);
  if (Number.isInteger(value) && Math.abs(value) < 1e7) return String(value);
  const abs = Math.abs(value);
  if (abs !== 0 && (abs < 1e-3 || abs >= 1e6)) return value.toExponential(3);
  return String(Number(value.toPrecision(6)));
}

// Axis labels: short enough for a fixed 56 px gutter (65536 -> 65.5k, 0.0002 -> 2e-4), so no label is clipped
// and every chart's plot starts at the same pixel (the linked crosshair lines up).
export function fmtAxis(value) {
  if (!Number.isFinite(value)) return "";
  const abs = Math.abs(value);
  if (abs === 0) return "0";
  if (abs >= 1e15 || abs < 1e-3) return value.toExponential(1).replace("e+", "e");
  const units = [[1e12, "T"], [1e9, "G"], [1e6, "M"], [1e4, "k"]];
  for (const [scale, unit] of units) {
    if (abs >= scale) return `${Number((value / scale).toPrecision(3))}${unit}`;
  }
  return String(Number(value.toPrecision(4)));
}

// Tick labels: plain when short (65536, 0.0002), else compact with just the digits the tick spacing needs
// (1.25M, 1.75e-4), so labels fit the fixed gutter and neighbouring ticks never print the same text.
export function fmtTick(value, interval) {
  if (!Number.isFinite(value)) return "";
  const plain = String(Number(value.toPrecision(12)));
  const abs = Math.abs(value);
  // Below 1e-3 the exponent is shorter than the zeros ("2e-5", not "0.00002"): labels fit the axis gutter.
  // Up to 6 characters fit the gutter; 5000000 would lose its first digit.
  if (plain.length <= 6 && !(abs > 0 && abs < 1e-3)) return plain;
  const sig = interval > 0 && abs > 0 ? Math.min(12, Math.max(2, Math.ceil(Math.log10(abs / interval)) + 2)) : 3;
  if (abs >= 1e4 && abs < 1e15) {
    for (const [scale, unit] of [[1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]]) {
      if (abs >= scale) return `${Number((value / scale).toPrecision(sig))}${unit}`;
    }
  }
  return Number(value.toPrecision(sig)).toExponential().replace("e+", "e");
}

// A name filter as in TensorBoard: a regular expression, case-insensitive; an invalid one is matched as plain text
// and said (`problem`), never thrown.
export function nameMatcher(text) {
  const trimmed = text.trim();
  if (!trimmed) return { test: () => true, problem: "" };
  try {
    const re = new RegExp(trimmed, "i");
    return { test: (name) => re.test(name), problem: "" };
  } catch (err) {
    const needle = trimmed.toLowerCase();
    return { test: (name) => name.toLowerCase().includes(needle),
      problem: `not a regular expression (${err.message.replace(/^Invalid regular expression: /, "")}): matched as text` };
  }
}

export function fmtDuration(seconds) {
  if (seconds === null || !Number.isFinite(seconds)) return "–";
  const s = Math.max(0, Math.round(seconds));
  const d = Math.floor(s / 86400);
  const h = Math.floor((s % 86400) / 3600);
  const m = Math.floor((s % 3600) / 60);
  const sec = s % 60;
  if (d) return `${d}d ${h}h`;
  if (h) return `${h}h ${String(m).padStart(2, "0")}m`;
  if (m) return `${m}m ${String(sec).padStart(2, "0")}s`;
  return `${sec}s`;
}

export function median(values) {
  const sorted = values.filter(Number.isFinite).sort((a, b) => a - b);
  if (!sorted.length) return null;
  const mid = sorted.length >> 1;
  return sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
}

export async function getJSON(url) {
  const response = await fetch(url, { cache: "no-store" });
  if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
  return response.json();
}

// Largest index i with arr[i] <= x in an ascending array (-1 if none).
export function bisectRight(arr, x) {
  let lo = 0;
  let hi = arr.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (arr[mid] <= x) lo = mid + 1; else hi = mid;
  }
  return lo - 1;
}

// One CSV cell. A text a spreadsheet would run as a formula (starting = + - @, tab or CR: `-1+cmd|...` too) goes
// behind a single quote (OWASP); numbers never do (-1.5 stays a number), nor "-Infinity", a number's name. Control
// characters (C0, DEL, C1) are written as JSON escapes them (`\n`, `\u001b`): no terminal escape from a log runs
// when the file is shown, and a row stays one line. `mstail parse --to csv` keeps the same rule
// (tailer/offline/output.py, csv_cell).
const CONTROL_NAMES = { "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r" };
export function csvCell(value) {
  if (value === null || value === undefined) return "";
  let text = String(value);
  if (typeof value === "string" && /^[=+\-@\t\r]/.test(text) && text !== "-Infinity") text = `'${text}`;
  text = text.replace(/[\x00-\x1f\x7f-\x9f]/g, (c) => CONTROL_NAMES[c] || `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);
  return /[",]/.test(text) ? `"${text.replace(/"/g, '""')}"` : text;
}

// A time (epoch seconds) as every CSV of mstail writes it: ISO 8601 in the local time zone with its offset, to the
// nearest millisecond (`2026-12-02T14:35:44.367+08:00`); "" for none. `mstail parse --to csv` writes the same
// (tailer/offline/output.py, csv_time), with the seconds in a `time_s` column beside it.
export function isoTime(seconds) {
  if (seconds === null || seconds === undefined) return "";
  const d = new Date(Math.round(seconds * 1000));
  if (Number.isNaN(d.getTime())) return "";
  const pad = (n, width = 2) => String(n).padStart(width, "0");
  const offset = -d.getTimezoneOffset();
  const zone = `${offset < 0 ? "-" : "+"}${pad(Math.floor(Math.abs(offset) / 60))}:${pad(Math.abs(offset) % 60)}`;
  return `${pad(d.getFullYear(), 4)}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:` +
    `${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}${zone}`;
}

export function download(name, href) {
  const a = document.createElement("a");
  a.href = href;
  a.download = name;
  a.rel = "noopener";
  document.body.append(a);
  a.click();
  a.remove();
}

export function safeName(text) {
  return String(text).replace(/[^\w.-]+/g, "_").slice(0, 80) || "chart";
}
