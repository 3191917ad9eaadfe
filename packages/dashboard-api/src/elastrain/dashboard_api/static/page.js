"use strict";
// The dashboard page: a list of runs and, for the selected one, charts of its metrics against step (uPlot,
// vendored with the package), its world size, markers at resets and crashes, its worker history and events.
// Every path is relative to the page, so it works mounted under a prefix or behind a proxy's root path.

// A dashboard with a token is opened as .../#token=<token>. The fragment never reaches a server, but it stays
// in the address bar, the history and any link copied from there: keep the token in this tab's session storage
// (it survives a reload) and take it out of the address at once. The selected run lives in the fragment too
// (#run=<id>), so a run's view can be linked and survives a reload.
const TOKEN_KEY = "elastrain-dashboard-token";
let headers = {};
// The fragment's run (null when it names none); stores a token it holds and takes it out of the address.
function readFragment() {
  const fragment = new URLSearchParams(location.hash.slice(1));
  if (fragment.has("token")) {
    sessionStorage.setItem(TOKEN_KEY, fragment.get("token"));
    fragment.delete("token");
    const rest = fragment.toString();
    history.replaceState(history.state, "", location.pathname + location.search + (rest ? "#" + rest : ""));
  }
  const token = sessionStorage.getItem(TOKEN_KEY);
  headers = token ? { Authorization: "Bearer " + token } : {};
  return fragment.get("run");
}
const REFRESH_MS = 3000;
const ENDED = new Set(["FINISHED", "ERRORED", "ABORTED"]);
const MARKER_COLORS = { reset: "#7b1fa2", crashed: "#d93025", removed: "#e37400" };
const SERIES_COLORS = ["#0b57d0", "#00838f", "#b06000", "#5e35b1", "#c2185b", "#2e7d32"];
const CHART_HEIGHT = 150;
let pages = 1, nextCursor = null, selected = readFragment();
// The selected run's history as last fetched; an ended run's is fetched once (until its status changes).
let loaded = { key: null };
// The charts on screen; `markers` is what the marker plugin draws, replaced with each new model.
const board = { runId: null, names: null, signature: null, charts: new Map(), worldSize: null, markers: [], stepTime: new Map() };
// For tests and the curious: the uPlot instances (and, per chart, u.elastrainMarkers: what was drawn, where).
window.elastrain = { runId: null, charts: {}, worldSize: null, markers: [] };

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) if (value !== null && value !== undefined) node.setAttribute(key, value);
  for (const child of children) node.append(child instanceof Node ? child : document.createTextNode(String(child ?? "")));
  return node;
}
function badge(status) { return el("span", { class: "badge " + status }, status); }
function duration(run) {
  const end = run.end_time_ms ?? Date.now();
  let s = Math.max(0, Math.round((end - run.start_time_ms) / 1000));
  const h = Math.floor(s / 3600); s -= h * 3600; const m = Math.floor(s / 60); s -= m * 60;
  return (h ? h + "h " : "") + (h || m ? m + "m " : "") + s + "s";
}
function clock(ms) { return ms == null ? "" : new Date(ms).toLocaleTimeString(); }
function started(ms) {
  return new Date(ms).toLocaleString(undefined, { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" });
}
// A legend's value: at the cursor, or the newest one while the cursor is elsewhere.
function latest(u, value, seriesIdx, idx) {
  if (idx != null) return value;
  const data = u.data[seriesIdx];
  for (let i = data.length - 1; i >= 0; i--) if (data[i] != null) return data[i];
  return null;
}
function number(v) {
  if (v == null || !Number.isFinite(v)) return "–";
  const a = Math.abs(v);
  if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(2);
  return String(Number(v.toPrecision(4)));
}
function compactStep(v) {
  const a = Math.abs(v);
  if (a >= 1e6) return Number((v / 1e6).toPrecision(3)) + "M";
  if (a >= 1e4) return Number((v / 1e3).toPrecision(3)) + "k";
  return String(v);
}
function host(w) { return w.hostname || w.node_ip || "–"; }
// One line of a detail: itself, or a trace's last line (the exception), after its first.
function oneLine(text) {
  const lines = (text || "").split("\n").map(line => line.trim()).filter(Boolean);
  return lines.length > 2 ? lines[0] + " … " + lines[lines.length - 1] : lines.join(" ");
}

async function api(path) {
  const response = await fetch(path, { headers });
  const body = await response.json().catch(() => ({}));
  if (response.status === 401) throw new Error((body.detail || "A token is needed.") + " Open this page as .../#token=<token>.");
  if (!response.ok) throw new Error(body.detail || ("HTTP " + response.status));
  return body;
}
function runPath(id, what) { return "api/train/runs/" + encodeURIComponent(id) + (what ? "/" + what : ""); }

// --- the list of runs ---------------------------------------------------------------------------------------
async function loadRuns() {
  const runs = []; let cursor = null;
  for (let page = 0; page < pages; page++) {
    const body = await api("api/train/runs?limit=50" + (cursor ? "&cursor=" + encodeURIComponent(cursor) : ""));
    runs.push(...body.runs); cursor = body.next_cursor;
    if (!cursor) break;
  }
  nextCursor = cursor;
  return runs;
}
function renderRuns(runs) {
  document.getElementById("runs").replaceChildren(...runs.map(run => {
    const row = el("tr", { class: "run" + (run.id === selected ? " selected" : ""), "data-run": run.id },
      el("td", {}, run.name), el("td", {}, badge(run.run_status)),
      el("td", {}, started(run.start_time_ms)), el("td", {}, duration(run)),
      el("td", {}, run.world_size), el("td", {}, run.resets));
    row.addEventListener("click", () => select(run.id));
    return row;
  }));
  const state = document.getElementById("list-state");
  state.hidden = runs.length > 0;
  state.className = "state";
  state.textContent = "No training runs yet. Runs appear here as soon as a job starts.";
  document.getElementById("more").hidden = !nextCursor;
}
function select(id) {
  selected = id;
  history.replaceState(history.state, "", location.pathname + location.search + "#run=" + encodeURIComponent(id));
  for (const row of document.querySelectorAll("tr.run")) row.classList.toggle("selected", row.dataset.run === id);
  refreshDetail();
}

// --- one run ------------------------------------------------------------------------------------------------
async function loadDetail(id) {
  const run = await api(runPath(id));
  const key = id + "|" + run.run_status + "|" + run.end_time_ms;
  if (!(ENDED.has(run.run_status) && loaded.key === key)) {
    const [metrics, events, workers] = await Promise.all(["metrics", "events", "workers"].map(what => api(runPath(id, what))));
    loaded = { key, metrics, events, workers };
  }
  return { run, ...loaded };
}
function renderSummary(run) {
  const facts = [["Started", started(run.start_time_ms)], ["Duration", duration(run)], ["World size", run.world_size],
    ["Workers (min–max)", (run.min_workers ?? "–") + " – " + (run.max_workers ?? "–")], ["Resets", run.resets]];
  const metrics = run.latest_metrics;
  if (metrics) {
    facts.push(["Step", metrics.step ?? "–"]);
    for (const [key, value] of Object.entries(metrics.values)) facts.push([key, value == null ? "NaN" : number(value)]);
  }
  document.getElementById("summary").replaceChildren(el("h2", {}, run.name, " ", badge(run.run_status)),
    el("div", { class: "ids" }, "run " + run.id + " · job " + run.job_id),
    el("dl", {}, ...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)])));
  document.getElementById("trace").replaceChildren(...(run.status_detail ? [el("h3", {}, "Why it ended"), el("pre", {}, run.status_detail)] : []));
}

// What the charts draw, from the metric history and the events: one x axis (steps) shared by every chart.
function chartModel(run, metrics, events) {
  const stepTime = new Map(metrics.steps.map((step, i) => [step, metrics.time_ms[i]]));
  const first = metrics.steps.length ? metrics.steps[0] : 0;
  const at = event => event.step ?? first;  // events before the first report sit at the first step
  // World size by step. A reset may roll the job back to an earlier step; the world after it then owns the
  // steps it runs again, as the metric history keeps a re-run step's latest values.
  let sizes = [];
  const markers = [];
  for (const event of events.events) {
    const step = at(event);
    if (!stepTime.has(step)) stepTime.set(step, event.time_ms);
    if (event.kind === "WORLD_SIZE") {
      while (sizes.length && sizes[sizes.length - 1][0] >= step) sizes.pop();
      sizes.push([step, event.world_size]);
    } else if (event.kind === "RESET") {
      markers.push({ kind: "reset", step, label: "reset " + event.resets });
    } else if (event.kind === "WORKER_EXITED") {
      const w = event.worker || {};
      markers.push({ kind: event.status === "REMOVED" ? "removed" : "crashed", step,
        label: "rank " + w.world_rank + " on " + host(w) + " " + String(event.status).toLowerCase() });
    }
  }
  if (!sizes.length && (metrics.steps.length || run.world_size)) sizes = [[first, run.world_size]];
  const xs = [...new Set([...metrics.steps, ...sizes.map(s => s[0]), ...markers.map(m => m.step)])].sort((a, b) => a - b);
  const index = new Map(metrics.steps.map((step, i) => [step, i]));
  const columns = {};
  for (const name of Object.keys(metrics.values)) {
    columns[name] = xs.map(x => index.has(x) ? metrics.values[name][index.get(x)] : null);
  }
  let current = null, next = 0;
  const worldSize = xs.map(x => {
    while (next < sizes.length && sizes[next][0] <= x) current = sizes[next++][1];
    return current;
  });
  const signature = JSON.stringify([xs.length, xs[xs.length - 1], metrics.steps_reported, events.events.length,
    events.dropped, worldSize[worldSize.length - 1]]);
  return { xs, columns, names: Object.keys(columns), worldSize, markers, stepTime, signature };
}

// Reset and crash markers, drawn over each chart: a dashed line with a diamond at the foot for a reset, a solid
// line with a triangle at the top for a worker that crashed (or was removed), so both show at the same step.
function markerPlugin() {
  return { hooks: { draw: [u => {
    const { left, top, width, height } = u.bbox;
    const ratio = uPlot.pxRatio || 1;
    const ctx = u.ctx;
    const drawn = [];
    for (const marker of board.markers) {
      const x = Math.round(u.valToPos(marker.step, "x", true));
      if (!Number.isFinite(x) || x < left - 1 || x > left + width + 1) continue;
      const reset = marker.kind === "reset";
      const s = 5 * ratio;
      ctx.save();
      ctx.strokeStyle = ctx.fillStyle = MARKER_COLORS[marker.kind];
      ctx.lineWidth = 2 * ratio;  // two whole pixels at an integer x: crisp, and a crash shows between reset dashes
      ctx.setLineDash(reset ? [5 * ratio, 3 * ratio] : []);
      ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, top + height); ctx.stroke();
      ctx.setLineDash([]);
      ctx.beginPath();
      if (reset) {
        const y = top + height - s;
        ctx.moveTo(x, y - s); ctx.lineTo(x + s, y); ctx.lineTo(x, y + s); ctx.lineTo(x - s, y);
      } else {
        ctx.moveTo(x - s, top); ctx.lineTo(x + s, top); ctx.lineTo(x, top + 1.6 * s);
      }
      ctx.closePath(); ctx.fill();
      ctx.restore();
      drawn.push({ kind: marker.kind, step: marker.step, label: marker.label, x: x / ratio });
    }
    u.elastrainMarkers = drawn;
  }] } };
}
function integerSplits() {
  const incrs = [];
  for (let e = 0; e < 16; e++) for (const m of [1, 2, 5]) incrs.push(m * 10 ** e);
  return incrs;
}
const STEP_INCRS = integerSplits();
function stepLabel(u, step, seriesIdx, idx) {
  step = latest(u, step, seriesIdx, idx);
  if (step == null) return "–";
  const time = board.stepTime.get(step);
  return "step " + step + (time ? " · " + clock(time) : "");
}
function chartOptions(width, series, extra) {
  return {
    width, height: CHART_HEIGHT, plugins: [markerPlugin()],
    cursor: { sync: { key: "elastrain-run" }, points: { size: 6 } },
    scales: { x: { time: false } },
    legend: { live: true },
    axes: [
      { incrs: STEP_INCRS, values: (u, splits) => splits.map(compactStep), size: 30, gap: 3 },
      { size: 54, gap: 3, values: (u, splits) => splits.map(number), ...(extra.yAxis || {}) },
    ],
    series: [{ label: "step", value: stepLabel }, ...series],
    ...(extra.options || {}),
  };
}
function chartWidth(container) { return Math.max(200, container.clientWidth - 12); }
function addChart(charts, title, id) {
  const box = el("div", { class: "chart", "data-chart": id }, el("h4", {}, title));
  charts.append(box);
  return box;
}
function clearCharts() {
  for (const u of board.charts.values()) u.destroy();
  board.worldSize?.destroy();
  board.charts = new Map(); board.worldSize = null; board.names = null; board.signature = null;
  document.getElementById("charts").replaceChildren();
  Object.assign(window.elastrain, { runId: null, charts: {}, worldSize: null, markers: [] });
}
function renderCharts(run, metrics, events) {
  const state = document.getElementById("chart-state");
  const charts = document.getElementById("charts");
  const say = text => { state.hidden = !text; state.textContent = text || ""; };
  if (typeof uPlot === "undefined") {
    clearCharts();
    return say("Charts are unavailable: uPlot did not load (static/uplot/ is missing from this installation).");
  }
  if (!metrics.retained) {
    clearCharts();
    return say("This run's history is no longer kept: only the newest runs keep one.");
  }
  const model = chartModel(run, metrics, events);
  if (board.runId !== run.id || JSON.stringify(board.names) !== JSON.stringify(model.names)) clearCharts();
  say(metrics.steps.length ? "" : "No metrics reported yet.");
  board.markers = model.markers; board.stepTime = model.stepTime;
  if (board.signature === model.signature) return;  // unchanged: keep the view (a zoom, the cursor) as it is
  board.signature = model.signature;
  const worldData = [model.xs, model.worldSize];
  if (board.worldSize) {
    board.worldSize.setData(worldData);
    for (const name of model.names) board.charts.get(name).setData([model.xs, model.columns[name]]);
  } else {
    board.runId = run.id; board.names = model.names;
    if (model.xs.length) {
      const box = addChart(charts, "World size", "world-size");
      board.worldSize = new uPlot(chartOptions(chartWidth(box), [{
        label: "world size", stroke: "#137333", width: 2, fill: "rgba(19, 115, 51, 0.08)", spanGaps: true,
        paths: uPlot.paths.stepped({ align: 1 }), points: { show: false },
        value: (u, v, si, idx) => latest(u, v, si, idx) ?? "–",
      }], {
        yAxis: { incrs: STEP_INCRS, values: (u, splits) => splits.map(String) },
        options: { scales: { x: { time: false }, y: { range: (u, min, max) => [0, Math.max(1, max ?? 1) + 1] } } },
      }), worldData, box);
    }
    model.names.forEach((name, i) => {
      const box = addChart(charts, name, name);
      const few = metrics.steps.length <= 120;
      board.charts.set(name, new uPlot(chartOptions(chartWidth(box), [{
        label: name, stroke: SERIES_COLORS[i % SERIES_COLORS.length], width: 1.5, spanGaps: true,
        points: { show: few, size: 4 }, value: (u, v, si, idx) => number(latest(u, v, si, idx)),
      }], {}), [model.xs, model.columns[name]], box));
    });
  }
  window.elastrain.runId = run.id;
  window.elastrain.charts = Object.fromEntries(board.charts);
  window.elastrain.worldSize = board.worldSize;
  window.elastrain.markers = model.markers;
}
new ResizeObserver(() => {
  for (const u of [board.worldSize, ...board.charts.values()]) {
    if (u) u.setSize({ width: chartWidth(u.root.parentElement), height: CHART_HEIGHT });
  }
}).observe(document.getElementById("charts"));

// Workers now and those that left, by host name (or IP) and pid: the worker history.
function renderWorkers(data) {
  const departed = new Set(data.departed.map(w => w.actor_id));
  const rows = [...data.workers.filter(w => !departed.has(w.actor_id)).map(w => [w, false]), ...data.departed.map(w => [w, true])];
  const target = document.getElementById("workers");
  if (!rows.length) return target.replaceChildren(el("div", { class: "state small" }, "No workers recorded."));
  const head = ["Rank", "Status", "Host", "PID", "GPUs", "Left", "Why"];
  target.replaceChildren(el("table", {},
    el("thead", {}, el("tr", {}, ...head.map(h => el("th", {}, h)))),
    el("tbody", {}, ...rows.map(([w, left]) => el("tr", { class: left ? "departed" : "present", "data-pid": w.pid },
      el("td", {}, w.world_rank), el("td", {}, badge(w.status)),
      el("td", { title: w.node_ip || null }, host(w), w.hostname && w.node_ip ? el("span", { class: "muted" }, " · " + w.node_ip) : ""),
      el("td", {}, w.pid ?? "–"), el("td", {}, (w.gpu_ids || []).join(",") || "–"),
      el("td", {}, left ? (w.left_step != null ? "step " + w.left_step + " · " : "") + clock(w.left_time_ms) : "–"),
      el("td", { class: "why" }, left ? (w.detail || "") : ""))))),
    ...(data.departed_dropped ? [el("div", { class: "state small" }, data.departed_dropped + " earlier departures are no longer kept.")] : []));
}
function describe(event) {
  const w = event.worker || {};
  switch (event.kind) {
    case "WORLD_SIZE": return (event.seq === 0 ? "first world: " : "world size ") + event.world_size;
    case "RESET": return "reset " + event.resets + ": a new world of " + event.world_size;
    case "WORKER_EXITED": return "rank " + w.world_rank + " on " + host(w) + " (pid " + w.pid + ") " +
      String(event.status).toLowerCase() + (event.detail ? ": " + oneLine(event.detail) : "");
    case "RUN_ENDED": return "run " + String(event.status).toLowerCase() + (event.detail ? ": " + oneLine(event.detail) : "");
    default: return event.kind;
  }
}
function renderEvents(data) {
  const target = document.getElementById("events");
  if (!data.retained) return target.replaceChildren(el("div", { class: "state small" }, "This run's events are no longer kept."));
  if (!data.events.length) return target.replaceChildren(el("div", { class: "state small" }, "No events yet."));
  const items = data.events.map(event => el("li", { class: event.kind + " " + String(event.status || "").toLowerCase() },
    el("span", { class: "when" }, clock(event.time_ms) + (event.step != null ? " · step " + event.step : "")),
    el("span", { class: "what" }, describe(event))));
  target.replaceChildren(el("ol", {}, ...items.reverse()),  // newest first
    ...(data.dropped ? [el("div", { class: "state small" }, data.dropped + " older events are no longer kept.")] : []));
}

async function refreshDetail() {
  const id = selected;
  const empty = document.getElementById("detail-empty"), view = document.getElementById("detail-run");
  if (!id) { empty.hidden = false; view.hidden = true; return; }
  try {
    const detail = await loadDetail(id);
    if (id !== selected) return;  // another run was picked meanwhile
    empty.hidden = true; view.hidden = false;
    renderSummary(detail.run);
    renderCharts(detail.run, detail.metrics, detail.events);
    renderWorkers(detail.workers);
    renderEvents(detail.events);
  } catch (error) {
    if (id !== selected) return;
    clearCharts(); loaded = { key: null };
    view.hidden = true; empty.hidden = false;
    empty.className = "state error"; empty.textContent = "Cannot load this run: " + error.message;
    return;
  }
  empty.className = "state";
}
async function refresh() {
  try {
    renderRuns(await loadRuns());
    document.getElementById("refreshed").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (error) {
    const state = document.getElementById("list-state");
    state.hidden = false; state.className = "state error"; state.textContent = "Cannot load runs: " + error.message;
    document.getElementById("refreshed").textContent = "error at " + new Date().toLocaleTimeString();
    return;
  }
  await refreshDetail();
}
// One refresh at a time: the next starts REFRESH_MS after the previous one ended.
async function loop() { await refresh(); setTimeout(loop, REFRESH_MS); }
document.getElementById("more").addEventListener("click", () => { pages++; refresh(); });
// A link to another run (or a token) opened in this tab changes only the fragment: no new page load.
window.addEventListener("hashchange", () => {
  const run = readFragment();
  if (run && run !== selected) select(run);
  else refresh();
});
loop();
