// The live stream: one EventSource on /api/stream?after=<last seq seen>, reconnected with backoff when it closes for
// good, and the connection indicator. Each message goes to its owner: records to the charts and the header strip,
// events to state.events, alerts to alerts.js, source updates to state.sources; `reset` reloads the page.
// Charts are made and redrawn through the callbacks app.js passes to setupStream (no import back into app.js).

import { RESERVED, num } from "./util.js";
import { state } from "./state.js";
import { MAX_MARKERS } from "./chart.js";
import { noteAlert, renderAlerts } from "./alerts.js";
import { noteRecord, noteSource, pollSources } from "./sources.js";

const RECONNECT_MAX_MS = 10000;

let chartFor = null;              // app.js: metric -> its chart (made on first use)
let scheduleRender = null;        // app.js: redraw what changed, at most every RENDER_MIN_INTERVAL_MS

export function setupStream(hooks) {
  ({ chartFor, scheduleRender } = hooks);
}

export function setConnection(text, cls) {
  const el = document.getElementById("connection");
  el.textContent = text;
  el.className = `conn ${cls}`;
}

export function noteEvent(event) {
  if (event.kind === "alert") return;
  state.events.push(event);
  if (state.events.length > 2 * MAX_MARKERS) state.events.splice(0, state.events.length - MAX_MARKERS);  // bounded
  if (event.kind === "end") state.ended.add(event.source);
  if (event.kind === "start" || event.kind === "resume") state.ended.delete(event.source);
  if (["start", "resume", "end", "error"].includes(event.kind)) {
    const known = state.lifecycle.get(event.source);
    if (!known || !(known.seq > event.seq)) state.lifecycle.set(event.source, event);
  }
}

export function connect() {
  if (state.stream) state.stream.close();
  const stream = new EventSource(`/api/stream?after=${state.lastSeq}`);
  state.stream = stream;
  stream.onopen = () => {
    setConnection("live", "conn-live");
    state.retryMs = 500;
    if (state.streamOpened) pollSources();  // a reconnect: the source messages sent meanwhile are not replayed
    state.streamOpened = true;
  };
  stream.addEventListener("records", (e) => {
    for (const record of JSON.parse(e.data)) {
      for (const key of Object.keys(record)) {
        if (RESERVED.has(key) || num(record[key]) === null) continue;
        chartFor(key).append(record);
      }
      noteRecord(record);
      state.lastSeq = Math.max(state.lastSeq, record.seq);
    }
    scheduleRender();
  });
  stream.addEventListener("amend", (e) => {
    // Values a later line added to a record already drawn (TimeMonitor's epoch times, a progress line): the
    // record's new metrics join its charts at its step; it stays one record (noteRecord counted it).
    const amend = JSON.parse(e.data);
    state.lastSeq = Math.max(state.lastSeq, amend.seq);
    for (const key of Object.keys(amend)) {
      if (RESERVED.has(key) || num(amend[key]) === null) continue;
      chartFor(key).append(amend);
    }
    scheduleRender();
  });
  stream.addEventListener("event", (e) => {
    const event = JSON.parse(e.data);
    state.lastSeq = Math.max(state.lastSeq, event.seq);
    noteEvent(event);
    for (const chart of state.charts.values()) chart.dirty = true;
    scheduleRender();
  });
  stream.addEventListener("alert", (e) => {
    const alert = JSON.parse(e.data);
    state.lastSeq = Math.max(state.lastSeq, alert.seq);
    noteAlert(alert, true);
    renderAlerts();
    scheduleRender();
  });
  stream.addEventListener("source", (e) => {
    noteSource(JSON.parse(e.data));
    scheduleRender();
  });
  stream.addEventListener("reset", () => window.location.reload());
  stream.onerror = () => {
    if (stream.readyState === EventSource.CLOSED) {
      // A proxy error or a non-200 answer closes EventSource for good: reconnect ourselves, with backoff.
      setConnection("offline", "conn-offline");
      setTimeout(connect, state.retryMs);
      state.retryMs = Math.min(state.retryMs * 2, RECONNECT_MAX_MS);
    } else {
      setConnection("reconnecting", "conn-connecting");
    }
  };
}
