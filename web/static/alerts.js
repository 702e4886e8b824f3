// Alerts: the badge and its panel, desktop notifications for newly firing alerts, and the marks they leave on the
// loss chart. The table comes from /api/alerts, then from the stream's `alert` messages (stream.js calls noteAlert).
// Alert text (rule, source, message) is set with textContent: never HTML.

import { getJSON } from "./util.js";
import { state } from "./state.js";

// Rules judged on a log line (its step's record): the alert's time is that record's, the log's own. The others
// (hang, gone, died, straggler) are judged on mstail's clock: their time is when mstail saw it.
const LINE_RULES = new Set(["nonfinite", "loss_spike", "grad_norm", "overflow", "loss_scale", "error", "trend"]);

export function alertMarks() {
  // One red line per alert step on the loss chart (both firing and resolved alerts: where things went wrong); the
  // same rule at the same step on several sources is one line ("straggler @ 138 ×3").
  const byStep = new Map();
  for (const alert of state.alerts.values()) {
    if (typeof alert.step !== "number") continue;
    const key = `${alert.step}`;
    let mark = byStep.get(key);
    if (!mark) { mark = { source: alert.source, step: alert.step, rules: new Map() }; byStep.set(key, mark); }
    mark.rules.set(alert.rule, (mark.rules.get(alert.rule) || 0) + 1);
  }
  return [...byStep.values()].map((m) => ({ source: m.source, step: m.step,
    text: [...m.rules].map(([rule, n]) => `${rule}${n > 1 ? ` ×${n}` : ""}`).join(", ") + ` @ ${m.step}` }));
}

export function noteAlert(alert, live) {
  const known = state.alerts.get(alert.id);
  state.alerts.set(alert.id, alert);
  if (live && alert.state === "firing" && alert.notify !== false && (!known || known.state !== "firing")) notify(alert);
  const loss = state.charts.get("loss");
  if (loss) loss.dirty = true;
}

function alertText(alert) {
  const step = typeof alert.step === "number" ? ` step ${alert.step}` : "";
  return `${alert.rule} · ${alert.source}${step}`;
}

function notify(alert) {
  if (!("Notification" in window) || Notification.permission !== "granted") return;
  try {
    new Notification(`mstail: ${alertText(alert)}`, { body: String(alert.message || ""), tag: alert.id });
  } catch (err) {
    console.warn("notification failed", err);
  }
}

export function renderAlerts() {
  const all = [...state.alerts.values()];
  const active = all.filter((a) => a.state === "firing");
  const badge = document.getElementById("alerts-badge");
  document.getElementById("alerts-count").textContent = String(active.length);
  badge.classList.toggle("firing", active.length > 0);
  badge.dataset.count = String(active.length);
  const list = document.getElementById("alerts-list");
  list.replaceChildren();
  all.sort((a, b) => (a.state === b.state ? b.last_seen - a.last_seen : a.state === "firing" ? -1 : 1));
  for (const alert of all) {
    const row = document.createElement("li");
    row.className = `alert ${alert.severity} ${alert.state}`;
    row.dataset.id = alert.id;
    row.dataset.rule = alert.rule;
    const sev = document.createElement("span");
    sev.className = "sev";
    sev.textContent = alert.state === "resolved" ? "resolved" : alert.severity;
    const what = document.createElement("span");
    what.className = "what";
    what.textContent = alertText(alert);
    const message = document.createElement("span");
    message.className = "message";
    message.textContent = String(alert.message || "");
    const when = document.createElement("span");
    when.className = "when";
    const count = alert.count > 1 ? ` ×${alert.count}` : "";
    when.textContent = `${alertWhen(alert)}${count}`;
    row.append(sev, what, message, when);
    list.append(row);
  }
  document.getElementById("alerts-none").hidden = all.length > 0;
}

// When the alert happened: the log's time of the record at its step (`logged_at`, the engine's) where the log gave
// one, else mstail's time said as such ("read time": the log has no time there; "seen": a rule of mstail's clock).
function alertWhen(alert) {
  if (typeof alert.logged_at === "number") return new Date(alert.logged_at * 1000).toLocaleString();
  const clock = new Date(alert.last_seen * 1000).toLocaleString();
  return LINE_RULES.has(alert.rule) ? `${clock} (read time)` : `${clock} (seen)`;
}

export function setupAlerts() {
  const badge = document.getElementById("alerts-badge");
  const panel = document.getElementById("alerts-panel");
  badge.addEventListener("click", () => {
    panel.hidden = !panel.hidden;
    badge.setAttribute("aria-expanded", String(!panel.hidden));
  });
  const ask = document.getElementById("alerts-notify");
  if ("Notification" in window && Notification.permission === "default") {
    ask.hidden = false;
    ask.addEventListener("click", () => {
      Notification.requestPermission().then(() => { ask.hidden = true; });
    });
  }
}

export async function loadAlerts() {
  try {
    const table = await getJSON("/api/alerts");
    for (const alert of [...table.resolved, ...table.active]) noteAlert(alert, false);
  } catch (err) {
    console.warn("alerts unavailable", err);
  }
  renderAlerts();
}
