// aenv's web dashboard (docs/dashboard.md). Plain JavaScript, no framework, no build step.
//
// The API key lives in this tab's sessionStorage only and goes out as the X-API-KEY header of
// each fetch; it is never written into a URL (the sign-in input has no name, so even a form
// submitted without this script carries nothing). Views are chosen by the URL's fragment
// (#sandboxes, #sandbox/<id>, #templates, ...), which only ever names objects.
//
// Every API error is shown in the banner. Lists fetch one page (100) at a time and render it
// with one DocumentFragment; the list's tbody says how long the last load took
// (data-load-ms: from the click to the rows in the DOM) for the browser test.
"use strict";

const KEY_SLOT = "aenv.dashboard.apiKey";
const PAGE_SIZE = 100;
const POLL_MS = 2000;
const CHART_POINTS = 60;
const LOG_LINES_KEPT = 1000;

const $ = (id) => document.getElementById(id);

class ApiError extends Error {
  constructor(status, message, method, path) {
    super(message);
    this.status = status;
    this.method = method;
    this.path = path;
  }
}

// -- the key -------------------------------------------------------------------------------

function apiKey() {
  return sessionStorage.getItem(KEY_SLOT);
}

function signIn(key) {
  sessionStorage.setItem(KEY_SLOT, key);
  $("banner").hidden = true;  // a new session: the last one's errors are not its own
  showSignedIn(true);
  route();
}

function signOut(reason) {
  sessionStorage.removeItem(KEY_SLOT);
  stopSandboxPolling();
  stopBuildPolling();
  for (const id of ["sandbox-rows", "template-rows", "snapshot-rows", "volume-rows",
                    "loop-rows", "event-rows", "webhook-rows"]) {
    $(id).replaceChildren();
  }
  $("sbx-detail").replaceChildren();
  $("log-area").replaceChildren();
  showSignedIn(false);
  if (reason) showError(reason);
}

function showSignedIn(yes) {
  $("signin").hidden = yes;
  $("tabs").hidden = !yes;
  $("signout").hidden = !yes;
  if (!yes) {
    for (const view of document.querySelectorAll(".view")) view.hidden = true;
    $("signin-key").value = "";
    $("signin-key").focus();
  }
}

// -- the API -------------------------------------------------------------------------------

async function api(method, path, { query, body } = {}) {
  const key = apiKey();
  if (!key) throw new ApiError(401, "not signed in", method, path);
  const url = new URL(path, window.location.origin);
  for (const [name, value] of Object.entries(query || {})) {
    if (value !== undefined && value !== null && value !== "") {
      url.searchParams.append(name, String(value));
    }
  }
  const headers = { "X-API-KEY": key, Accept: "application/json" };
  const init = { method, headers, cache: "no-store", credentials: "omit",
                 referrerPolicy: "no-referrer" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await send(url, init, method, path);
  const text = await response.text();
  let data = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = text;
    }
  }
  if (!response.ok) {
    const message = (data && typeof data === "object" && data.message) ||
      (typeof data === "string" && data) || response.statusText;
    throw new ApiError(response.status, message, method, path);
  }
  return { data, headers: response.headers, status: response.status };
}

// A fetch that got no answer at all (a connection reset as the browser reused it, a busy
// host) is tried again after a pause when it reads (GET); anything else would repeat an
// action the node may have taken, so its failure goes straight to the banner.
const RETRY_PAUSES_MS = [250, 1000];

async function send(url, init, method, path) {
  const pauses = method === "GET" ? RETRY_PAUSES_MS : [];
  for (let attempt = 0; ; attempt++) {
    try {
      return await fetch(url, init);
    } catch (err) {
      if (attempt >= pauses.length) {
        throw new ApiError(0, `the server could not be reached (${err.message})`, method, path);
      }
      await new Promise((resolve) => setTimeout(resolve, pauses[attempt]));
    }
  }
}

// Run an action; an error goes to the banner (a 401 also signs out). Returns undefined then.
async function guarded(fn) {
  try {
    return await fn();
  } catch (err) {
    report(err);
    return undefined;
  }
}

function report(err) {
  if (err instanceof ApiError) {
    const where = `${err.method} ${err.path}`;
    if (err.status === 401) {
      signOut(`${where} → 401: ${err.message} (signed out)`);
      return;
    }
    showError(`${where} → ${err.status || "no answer"}: ${err.message}`);
  } else {
    showError(`unexpected error: ${err && err.message ? err.message : err}`);
  }
}

function showError(message) {
  $("banner-text").textContent = message;
  $("banner").hidden = false;
  $("banner").dataset.count = String(Number($("banner").dataset.count || 0) + 1);
}

let noticeTimer = null;
function notify(message) {
  const box = $("notice");
  box.textContent = message;
  box.hidden = false;
  clearTimeout(noticeTimer);
  noticeTimer = setTimeout(() => { box.hidden = true; }, 6000);
}

// -- small DOM helpers ---------------------------------------------------------------------

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function cells(row, values) {
  for (const value of values) {
    const td = document.createElement("td");
    if (value instanceof Node) td.append(value);
    else td.textContent = value === undefined || value === null ? "" : String(value);
    row.append(td);
  }
  return row;
}

function emptyRow(tbody, columns, text) {
  const tr = document.createElement("tr");
  const td = el("td", text, "muted");
  td.colSpan = columns;
  tr.append(td);
  tbody.replaceChildren(tr);
}

function kv(dl, pairs) {
  const frag = document.createDocumentFragment();
  for (const [name, value] of pairs) {
    if (value === undefined || value === null || value === "") continue;
    frag.append(el("dt", name), el("dd", value));
  }
  dl.replaceChildren(frag);
}

const pad = (n) => String(n).padStart(2, "0");
function when(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return iso;
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

function mib(bytes) {
  return `${Math.round(bytes / 1048576)} MiB`;
}

function metadataText(metadata) {
  return Object.entries(metadata || {}).map(([k, v]) => `${k}=${v}`).join(", ");
}

// E2B's metadata filter: ``k=v&k2=v2`` with each key and value encoded, the whole encoded
// once more by URLSearchParams (api/listing.py decodes the three layers).
function metadataQuery(text) {
  const pairs = [];
  for (const part of text.split(/[,&]/)) {
    const trimmed = part.trim();
    if (!trimmed) continue;
    const at = trimmed.indexOf("=");
    if (at <= 0) throw new Error(`metadata filter "${trimmed}": expected key=value`);
    const k = trimmed.slice(0, at).trim();
    const v = trimmed.slice(at + 1).trim();
    pairs.push(`${encodeURIComponent(encodeURIComponent(k))}=` +
               `${encodeURIComponent(encodeURIComponent(v))}`);
  }
  return pairs.join("&");
}

// -- views ---------------------------------------------------------------------------------

const VIEWS = ["sandboxes", "sandbox", "templates", "snapshots", "volumes", "node", "events"];

function route() {
  if (!apiKey()) {
    showSignedIn(false);
    return;
  }
  showSignedIn(true);
  const hash = window.location.hash.replace(/^#/, "");
  const [name, arg] = hash.split("/", 2);
  const view = VIEWS.includes(name) ? name : "sandboxes";
  for (const section of document.querySelectorAll(".view")) {
    section.hidden = section.dataset.view !== view;
  }
  for (const tab of document.querySelectorAll("#tabs a")) {
    tab.classList.toggle("active", tab.dataset.tab === view ||
      (view === "sandbox" && tab.dataset.tab === "sandboxes"));
  }
  if (view !== "sandbox") stopSandboxPolling();
  if (view !== "templates") stopBuildPolling();
  document.body.dataset.view = view;
  switch (view) {
    case "sandboxes": loadSandboxes(performance.now()); break;
    case "sandbox": openSandbox(decodeURIComponent(arg || "")); break;
    case "templates": loadTemplates(); break;
    case "snapshots": loadSnapshots(); break;
    case "volumes": loadVolumes(); break;
    case "node": loadNode(); break;
    case "events": loadEvents(); break;
  }
}

// -- sandboxes -----------------------------------------------------------------------------

const list = {
  tokens: [null],   // nextToken of each page seen so far; [0] is the first page
  index: 0,
  next: null,
  filters: { state: "running,paused", template: "", metadata: "" },
  rows: [],
  seq: 0,
  generation: 0,
};

async function loadSandboxes(started) {
  const seq = ++list.seq;
  const tbody = $("sandbox-rows");
  tbody.dataset.loading = "1";
  await guarded(async () => {
    const query = {
      state: list.filters.state,
      limit: PAGE_SIZE,
      template: list.filters.template,
      metadata: list.filters.metadata ? metadataQuery(list.filters.metadata) : "",
      nextToken: list.tokens[list.index],
    };
    const { data, headers } = await api("GET", "/v2/sandboxes", { query });
    if (seq !== list.seq) return;  // a newer load took over
    list.next = headers.get("X-Next-Token");
    list.rows = data;
    const drawing = performance.now();
    renderSandboxRows(tbody, data);
    const done = performance.now();
    tbody.dataset.rows = String(data.length);
    tbody.dataset.renderMs = (done - drawing).toFixed(1);
    tbody.dataset.loadMs = (done - started).toFixed(1);
    tbody.dataset.generation = String(++list.generation);
    const total = headers.get("X-Total-Running");
    $("count-running").textContent = total === null ? "?" : total;
    $("prev-page").disabled = list.index === 0;
    $("next-page").disabled = !list.next;
    const first = list.index * PAGE_SIZE;
    $("page-info").textContent = data.length
      ? `page ${list.index + 1}: ${first + 1}–${first + data.length}${list.next ? "" : " (last)"}`
      : "no sandboxes";
    // After the rows are in: the paused count and this page's live usage. data-settled
    // names the load whose follow-up calls are done too.
    const generation = list.generation;
    Promise.all([countPaused(seq), fillUsage(seq, data)]).then(() => {
      if (seq === list.seq) tbody.dataset.settled = String(generation);
    });
  });
  if (seq === list.seq) delete tbody.dataset.loading;
}

function renderSandboxRows(tbody, sandboxes) {
  if (!sandboxes.length) {
    emptyRow(tbody, 8, "No sandboxes match.");
    return;
  }
  const frag = document.createDocumentFragment();
  for (const s of sandboxes) {
    const tr = document.createElement("tr");
    tr.dataset.test = "sandbox-row";
    tr.dataset.id = s.sandboxID;
    tr.className = "clickable";
    const link = el("a", s.sandboxID);
    link.href = `#sandbox/${encodeURIComponent(s.sandboxID)}`;
    const cpu = el("span", `${s.cpuCount} vCPU`);
    cpu.dataset.usage = "cpu";
    const mem = el("span", `${s.memoryMB} MiB`);
    mem.dataset.usage = "mem";
    cells(tr, [link, s.alias || s.templateID, el("span", s.state, `pill ${s.state}`), cpu, mem,
               when(s.startedAt), when(s.endAt), metadataText(s.metadata)]);
    frag.append(tr);
  }
  tbody.replaceChildren(frag);
}

async function countPaused(seq) {
  await guarded(async () => {
    const { data, headers } = await api("GET", "/v2/sandboxes",
                                        { query: { state: "paused", limit: PAGE_SIZE } });
    if (seq !== list.seq) return;
    // One page at most: beyond it the count says "100+" rather than walking every page.
    $("count-paused").textContent = headers.get("X-Next-Token")
      ? `${data.length}+` : String(data.length);
  });
}

async function fillUsage(seq, sandboxes) {
  const running = sandboxes.filter((s) => s.state === "running").map((s) => s.sandboxID);
  if (!running.length) return;
  await guarded(async () => {
    const { data } = await api("GET", "/sandboxes/metrics",
                               { query: { sandbox_ids: running.join(",") } });
    if (seq !== list.seq) return;
    const found = data.sandboxes || {};
    for (const tr of $("sandbox-rows").children) {
      const m = found[tr.dataset.id];
      if (!m) continue;
      tr.querySelector('[data-usage="cpu"]').textContent =
        `${m.cpuUsedPct.toFixed(1)}% of ${m.cpuCount}`;
      tr.querySelector('[data-usage="mem"]').textContent =
        `${mib(m.memUsed)} / ${mib(m.memTotal)}`;
    }
  });
}

function applyFilters(event) {
  event.preventDefault();
  const metadata = $("filter-metadata").value.trim();
  try {
    metadataQuery(metadata);
  } catch (err) {
    showError(err.message);
    return;
  }
  list.filters = { state: $("filter-state").value, template: $("filter-template").value.trim(),
                   metadata };
  list.tokens = [null];
  list.index = 0;
  loadSandboxes(performance.now());
}

// -- one sandbox ---------------------------------------------------------------------------

const sbx = {
  id: null,
  timers: [],
  points: [],
  cursor: null,
  seen: new Set(),
  detail: null,
  busy: false,
  gone: false,
  // Bumped when an action starts: a poll sent before it may meet the sandbox mid-operation
  // (409 "is pausing", "is killing"); that answer is the action's doing, not an error.
  epoch: 0,
};

// A poll's error, unless an action on the sandbox started since the poll was sent (the
// action reports its own outcome).
function pollFailed(err, epoch) {
  if (epoch !== sbx.epoch || sbx.busy) return;
  report(err);
}

function stopSandboxPolling() {
  for (const t of sbx.timers) clearInterval(t);
  sbx.timers = [];
  sbx.id = null;
}

function openSandbox(id) {
  stopSandboxPolling();
  Object.assign(sbx, { id, points: [], cursor: null, seen: new Set(), detail: null,
                       busy: false, gone: false });
  $("sbx-id").textContent = id;
  $("sbx-state").textContent = "";
  $("sbx-detail").replaceChildren();
  $("log-area").replaceChildren();
  $("log-area").dataset.lines = "0";
  $("kill-confirm").hidden = true;
  $("chart-now").textContent = "";
  drawChart();
  refreshDetail();
  pollMetrics();
  pollLogs();
  sbx.timers.push(setInterval(pollMetrics, POLL_MS), setInterval(pollLogs, POLL_MS),
                  setInterval(refreshDetail, POLL_MS * 2));
}

function sandboxPath(suffix = "") {
  return `/sandboxes/${encodeURIComponent(sbx.id)}${suffix}`;
}

async function refreshDetail() {
  const id = sbx.id;
  const epoch = sbx.epoch;
  if (!id || sbx.busy) return;
  try {
    const { data } = await api("GET", sandboxPath());
    if (id !== sbx.id) return;
    sbx.detail = data;
    const now = data.aenv || {};
    $("sbx-state").textContent = now.state || data.state;
    $("sbx-state").className = `pill ${data.state}`;
    kv($("sbx-detail"), [
      ["template", data.alias ? `${data.alias} (${data.templateID})` : data.templateID],
      ["state", now.operation ? `${now.state} (${now.operation})` : (now.state || data.state)],
      ["CPU", `${data.cpuCount} vCPU`],
      ["memory", `${data.memoryMB} MiB`],
      ["disk", `${data.diskSizeMB} MiB`],
      ["started", when(data.startedAt)],
      ["ends", when(data.endAt)],
      ["on timeout", data.lifecycle ? data.lifecycle.onTimeout : ""],
      ["envd", data.envdVersion],
      ["internet", data.allowInternetAccess === false ? "denied" : "allowed"],
      ["metadata", metadataText(data.metadata)],
      ["envd unresponsive", data.envdUnresponsive ? data.envdUnresponsiveReason || "yes" : ""],
      ["last error", now.lastError],
    ]);
    setButtons();
  } catch (err) {
    if (id !== sbx.id) return;
    if (err instanceof ApiError && err.status === 404) {
      sbx.gone = true;
      $("sbx-state").textContent = "gone";
      $("sbx-state").className = "pill gone";
      setButtons();
      for (const t of sbx.timers) clearInterval(t);
      sbx.timers = [];
    }
    pollFailed(err, epoch);
  }
}

function setButtons() {
  const state = sbx.detail ? sbx.detail.state : null;
  const off = sbx.busy || sbx.gone;
  $("act-pause").disabled = off || state !== "running";
  $("act-resume").disabled = off || state !== "paused";
  $("act-fork").disabled = off || state !== "running";
  $("act-kill").disabled = off;
}

async function pollMetrics() {
  const id = sbx.id;
  const epoch = sbx.epoch;
  if (!id || sbx.gone || sbx.busy) return;
  try {
    const { data } = await api("GET", sandboxPath("/metrics"));
    if (id !== sbx.id) return;
    if (!data.length) {
      $("chart-now").textContent = sbx.detail && sbx.detail.state === "paused"
        ? "paused: no samples" : "no sample";
      return;
    }
    const m = data[data.length - 1];
    sbx.points.push({
      at: m.timestampUnix,
      cpu: Math.max(0, Math.min(100, m.cpuUsedPct)),
      mem: m.memTotal ? (100 * m.memUsed) / m.memTotal : 0,
    });
    if (sbx.points.length > CHART_POINTS) sbx.points.splice(0, sbx.points.length - CHART_POINTS);
    $("chart-now").textContent = `CPU ${m.cpuUsedPct.toFixed(1)}% of ${m.cpuCount} · ` +
      `memory ${mib(m.memUsed)} / ${mib(m.memTotal)}`;
    drawChart();
  } catch (err) {
    if (id === sbx.id) pollFailed(err, epoch);
  }
}

function plotFrame(canvas) {
  const ctx = canvas.getContext("2d");
  const w = canvas.width;
  const h = canvas.height;
  ctx.clearRect(0, 0, w, h);
  const box = { left: 40, right: w - 10, top: 10, bottom: h - 20 };
  ctx.strokeStyle = "#d6dbe3";
  ctx.fillStyle = "#6b7280";
  ctx.font = "11px sans-serif";
  ctx.lineWidth = 1;
  return { ctx, box };
}

function drawLine(ctx, box, values, max, color, count) {
  if (!values.length) return;
  const span = Math.max(count - 1, 1);
  ctx.strokeStyle = color;
  ctx.lineWidth = 2;
  ctx.beginPath();
  values.forEach((v, i) => {
    const x = box.left + ((box.right - box.left) * i) / span;
    const y = box.bottom - ((box.bottom - box.top) * v) / (max || 1);
    if (i === 0) ctx.moveTo(x, y);
    else ctx.lineTo(x, y);
  });
  if (values.length === 1) {
    const y = box.bottom - ((box.bottom - box.top) * values[0]) / (max || 1);
    ctx.lineTo(box.right, y);
  }
  ctx.stroke();
}

function drawChart() {
  const canvas = $("chart");
  const { ctx, box } = plotFrame(canvas);
  for (const pct of [0, 25, 50, 75, 100]) {
    const y = box.bottom - ((box.bottom - box.top) * pct) / 100;
    ctx.beginPath();
    ctx.moveTo(box.left, y);
    ctx.lineTo(box.right, y);
    ctx.stroke();
    ctx.fillText(`${pct}%`, 4, y + 4);
  }
  ctx.fillText(`last ${CHART_POINTS} samples, every ${POLL_MS / 1000} s`, box.left, canvas.height - 4);
  drawLine(ctx, box, sbx.points.map((p) => p.mem), 100, "#7c3aed", CHART_POINTS);
  drawLine(ctx, box, sbx.points.map((p) => p.cpu), 100, "#0891b2", CHART_POINTS);
  canvas.dataset.points = String(sbx.points.length);
}

async function pollLogs() {
  const id = sbx.id;
  const epoch = sbx.epoch;
  if (!id) return;
  try {
    // First a tail (the newest 200, backward), then forward from the newest entry's time.
    const query = sbx.cursor === null
      ? { direction: "backward", limit: 200 }
      : { cursor: sbx.cursor, limit: 500 };
    const { data } = await api("GET", `/v2/sandboxes/${encodeURIComponent(id)}/logs`, { query });
    if (id !== sbx.id) return;
    const entries = sbx.cursor === null ? data.logs.slice().reverse() : data.logs;
    appendLogs(entries);
  } catch (err) {
    if (id === sbx.id) pollFailed(err, epoch);
  }
}

function appendLogs(entries) {
  const area = $("log-area");
  const frag = document.createDocumentFragment();
  let added = 0;
  for (const e of entries) {
    // The next page starts at the last entry's millisecond: an entry there comes again.
    const key = `${e.timestamp}|${e.level}|${e.message}|${JSON.stringify(e.fields)}`;
    const at = Date.parse(e.timestamp);
    if (!Number.isNaN(at)) sbx.cursor = Math.max(sbx.cursor || 0, at);
    if (sbx.seen.has(key)) continue;
    sbx.seen.add(key);
    const fields = Object.entries(e.fields || {}).map(([k, v]) => `${k}=${v}`).join(" ");
    const line = el("div", `${when(e.timestamp)}  ${e.level.toUpperCase().padEnd(5)}  ` +
                           `${e.message}${fields ? `  ${fields}` : ""}`, `log ${e.level}`);
    line.dataset.test = "log-line";
    frag.append(line);
    added += 1;
  }
  if (sbx.cursor === null) sbx.cursor = 0;
  if (!added) return;
  const stick = area.scrollTop + area.clientHeight >= area.scrollHeight - 4;
  area.append(frag);
  while (area.childElementCount > LOG_LINES_KEPT) area.firstElementChild.remove();
  area.dataset.lines = String(area.childElementCount);
  if (stick) area.scrollTop = area.scrollHeight;
}

async function act(label, fn) {
  if (sbx.busy) return;
  sbx.busy = true;
  sbx.epoch += 1;
  setButtons();
  try {
    await fn();
  } catch (err) {
    report(err);
  } finally {
    sbx.busy = false;
    if (sbx.id) {
      setButtons();
      refreshDetail();
    }
  }
}

function pause() {
  return act("pause", async () => {
    await api("POST", sandboxPath("/pause"));
    notify(`Sandbox ${sbx.id} paused.`);
  });
}

function resume() {
  return act("resume", async () => {
    await api("POST", sandboxPath("/connect"), { body: { timeout: 300 } });
    notify(`Sandbox ${sbx.id} resumed (timeout 300 s).`);
  });
}

function fork() {
  return act("fork", async () => {
    const { data } = await api("POST", sandboxPath("/fork"), { body: { count: 1 } });
    const made = data.filter((e) => e.sandbox).map((e) => e.sandbox.sandboxID);
    const failed = data.filter((e) => e.error).map((e) => `${e.error.code}: ${e.error.message}`);
    if (failed.length) showError(`fork of ${sbx.id}: ${failed.join("; ")}`);
    if (made.length) notify(`Forked ${sbx.id} into ${made.join(", ")}.`);
  });
}

function askKill() {
  if (!sbx.gone) $("kill-confirm").hidden = false;
}

function kill() {
  $("kill-confirm").hidden = true;
  const id = sbx.id;
  return act("kill", async () => {
    await api("DELETE", sandboxPath());
    stopSandboxPolling();
    notify(`Sandbox ${id} killed.`);
    window.location.hash = "#sandboxes";
  });
}

// -- templates, snapshots, volumes ---------------------------------------------------------

async function loadTemplates() {
  await guarded(async () => {
    const { data } = await api("GET", "/templates");
    const tbody = $("template-rows");
    if (!data.length) {
      emptyRow(tbody, 8, "No templates.");
      return;
    }
    const frag = document.createDocumentFragment();
    for (const t of data) {
      const tr = document.createElement("tr");
      tr.className = "clickable";
      tr.dataset.test = "template-row";
      tr.dataset.id = t.templateID;
      tr.dataset.build = t.buildID;
      cells(tr, [t.templateID, [...new Set([...t.names, ...t.aliases])].join(", "), t.buildID,
                 el("span", t.buildStatus, `pill ${t.buildStatus}`), `${t.cpuCount} vCPU`,
                 `${t.memoryMB} MiB`, when(t.createdAt), t.spawnCount]);
      frag.append(tr);
    }
    tbody.replaceChildren(frag);
  });
}

const build = { timer: null, offset: 0, key: null };

function stopBuildPolling() {
  clearTimeout(build.timer);
  build.timer = null;
  build.key = null;
}

function openBuild(templateID, buildID) {
  stopBuildPolling();
  build.key = `${templateID}/${buildID}`;
  build.offset = 0;
  $("build-card").hidden = false;
  $("build-id").textContent = `${templateID} / ${buildID}`;
  $("build-status").textContent = "";
  $("build-logs").replaceChildren();
  pollBuild(templateID, buildID, build.key, 0);
}

async function pollBuild(templateID, buildID, key, pages) {
  const path = `/templates/${encodeURIComponent(templateID)}/builds/` +
    `${encodeURIComponent(buildID)}/status`;
  let status = null;
  let full = false;
  await guarded(async () => {
    const { data } = await api("GET", path, { query: { logsOffset: build.offset, limit: 100 } });
    if (key !== build.key) return;
    status = data.status;
    $("build-status").textContent = data.status;
    $("build-status").className = `pill ${data.status}`;
    const logs = $("build-logs");
    if (data.logEntries.length) {
      for (const old of logs.querySelectorAll(".placeholder")) old.remove();
    } else if (!logs.childElementCount) {
      logs.append(el("div", "(no log lines yet)", "log debug placeholder"));
    }
    const frag = document.createDocumentFragment();
    for (const e of data.logEntries) {
      frag.append(el("div", `${when(e.timestamp)}  ${e.level.toUpperCase().padEnd(5)}  ` +
                            `${e.step ? `[${e.step}] ` : ""}${e.message}`, `log ${e.level}`));
    }
    logs.append(frag);
    build.offset += data.logEntries.length;
    full = data.logEntries.length >= 100;
    if (data.reason) {
      $("build-logs").append(el("div", `reason: ${data.reason.message}`, "log error"));
    }
  });
  if (key !== build.key) return;
  // One page (100 lines) a call: the next at once while pages are full, then every 2 s
  // while the build runs. A call that failed (shown in the banner: the node restarting, a
  // network hiccup) is tried again, or the card would stay empty until it is reopened.
  if (status === null) {
    build.timer = setTimeout(() => pollBuild(templateID, buildID, key, pages), POLL_MS);
  } else if (full && pages < 50) {
    pollBuild(templateID, buildID, key, pages + 1);
  } else if (status === "building" || status === "waiting") {
    build.timer = setTimeout(() => pollBuild(templateID, buildID, key, 0), POLL_MS);
  }
}

const snaps = { tokens: [null], index: 0, next: null };

async function loadSnapshots() {
  await guarded(async () => {
    const { data, headers } = await api("GET", "/snapshots",
      { query: { limit: PAGE_SIZE, nextToken: snaps.tokens[snaps.index] } });
    snaps.next = headers.get("X-Next-Token");
    const tbody = $("snapshot-rows");
    if (!data.length) {
      emptyRow(tbody, 2, "No snapshots.");
    } else {
      const frag = document.createDocumentFragment();
      for (const s of data) {
        frag.append(cells(document.createElement("tr"), [s.snapshotID, s.names.join(", ")]));
      }
      tbody.replaceChildren(frag);
    }
    $("snap-prev").disabled = snaps.index === 0;
    $("snap-next").disabled = !snaps.next;
  });
}

async function loadVolumes() {
  await guarded(async () => {
    const { data } = await api("GET", "/volumes");
    const tbody = $("volume-rows");
    if (!data.length) {
      emptyRow(tbody, 3, "No volumes.");
      return;
    }
    const frag = document.createDocumentFragment();
    for (const v of data) {
      frag.append(cells(document.createElement("tr"),
                        [v.volumeID, v.name, v.sizeMB ? `${v.sizeMB} MiB` : ""]));
    }
    tbody.replaceChildren(frag);
  });
}

// -- the node (operator only) --------------------------------------------------------------

async function loadNode() {
  try {
    const [pools, loops] = await Promise.all([api("GET", "/node/pools"),
                                              api("GET", "/node/loops")]);
    $("node-denied").hidden = true;
    $("node-info").hidden = false;
    kv($("node-pools"), [["network slots ready", pools.data.networkSlots],
                         ["warm sandboxes", pools.data.warm],
                         ["pre-created sandboxes", pools.data.precreated],
                         ["being made for the pools", pools.data.making],
                         ["paused, ready to resume", pools.data.resumeReady]]);
    $("loops-health").textContent = loops.data.healthy ? "healthy" : "backing off";
    $("loops-health").className = `pill ${loops.data.healthy ? "running" : "error"}`;
    const frag = document.createDocumentFragment();
    for (const loop of loops.data.loops) {
      frag.append(cells(document.createElement("tr"),
                        [loop.name, loop.state, loop.failures, loop.lastError || ""]));
    }
    $("loop-rows").replaceChildren(frag);
  } catch (err) {
    if (err instanceof ApiError && err.status === 403) {
      // A team's key: the node's own routes are the operator's. Not an error of the page.
      $("node-info").hidden = true;
      $("node-denied").hidden = false;
      return;
    }
    report(err);
  }
}

// -- events --------------------------------------------------------------------------------

async function loadEvents() {
  await Promise.all([loadTeamSeries(), loadRecentEvents(), loadWebhooks()]);
}

async function loadTeamSeries() {
  await guarded(async () => {
    const { data: teams } = await api("GET", "/teams");
    const team = teams.length === 1 ? teams[0] : teams.find((t) => t.isDefault) || teams[0];
    if (!team) return;
    $("team-name").textContent = `(team ${team.name})`;
    const { data } = await api("GET", `/teams/${encodeURIComponent(team.teamID)}/metrics`);
    const canvas = $("team-chart");
    const { ctx, box } = plotFrame(canvas);
    const values = data.map((p) => p.concurrentSandboxes);
    const max = Math.max(1, ...values);
    for (const frac of [0, 0.5, 1]) {
      const y = box.bottom - (box.bottom - box.top) * frac;
      ctx.beginPath();
      ctx.moveTo(box.left, y);
      ctx.lineTo(box.right, y);
      ctx.stroke();
      ctx.fillText(String(Math.round(max * frac)), 4, y + 4);
    }
    if (data.length) {
      ctx.fillText(when(data[0].timestamp), box.left, canvas.height - 4);
      const last = when(data[data.length - 1].timestamp);
      ctx.fillText(last, box.right - ctx.measureText(last).width, canvas.height - 4);
    }
    drawLine(ctx, box, values, max, "#0891b2", values.length);
    canvas.dataset.points = String(values.length);
  });
}

async function loadRecentEvents() {
  await guarded(async () => {
    let sandboxes = list.rows;
    if (!sandboxes.length) {
      ({ data: sandboxes } = await api("GET", "/v2/sandboxes", { query: { limit: 8 } }));
    }
    const picked = sandboxes.slice(0, 8);
    const pages = await Promise.all(picked.map((s) =>
      api("GET", `/v2/sandboxes/${encodeURIComponent(s.sandboxID)}/logs`,
          { query: { direction: "backward", limit: 5, level: "info" } })
        .then(({ data }) => data.logs.map((e) => ({ ...e, sandboxID: s.sandboxID })))));
    const events = pages.flat().sort((a, b) => b.timestamp.localeCompare(a.timestamp));
    const tbody = $("event-rows");
    if (!events.length) {
      emptyRow(tbody, 4, "No recent events.");
      return;
    }
    const frag = document.createDocumentFragment();
    for (const e of events.slice(0, 40)) {
      const link = el("a", e.sandboxID);
      link.href = `#sandbox/${encodeURIComponent(e.sandboxID)}`;
      frag.append(cells(document.createElement("tr"),
                        [when(e.timestamp), link, el("span", e.level, `pill ${e.level}`),
                         e.message]));
    }
    tbody.replaceChildren(frag);
  });
}

async function loadWebhooks() {
  await guarded(async () => {
    const { data } = await api("GET", "/events/webhooks");
    const tbody = $("webhook-rows");
    if (!data.length) {
      emptyRow(tbody, 4, "No webhooks.");
      return;
    }
    const frag = document.createDocumentFragment();
    for (const w of data) {
      frag.append(cells(document.createElement("tr"),
                        [w.name, w.url, w.events.join(", ") || "all", w.enabled ? "yes" : "no"]));
    }
    tbody.replaceChildren(frag);
  });
}

// -- wiring --------------------------------------------------------------------------------

function start() {
  $("signin-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const key = $("signin-key").value.trim();
    $("signin-key").value = "";
    if (key) signIn(key);
  });
  $("signout").addEventListener("click", () => signOut());
  $("banner-close").addEventListener("click", () => { $("banner").hidden = true; });
  $("filters").addEventListener("submit", applyFilters);
  $("refresh").addEventListener("click", () => loadSandboxes(performance.now()));
  $("next-page").addEventListener("click", () => {
    if (!list.next) return;
    const started = performance.now();
    list.tokens = list.tokens.slice(0, list.index + 1);
    list.tokens.push(list.next);
    list.index += 1;
    loadSandboxes(started);
  });
  $("prev-page").addEventListener("click", () => {
    if (list.index === 0) return;
    const started = performance.now();
    list.index -= 1;
    loadSandboxes(started);
  });
  $("sandbox-rows").addEventListener("click", (event) => {
    const tr = event.target.closest("tr[data-id]");
    if (tr && !event.target.closest("a")) {
      window.location.hash = `#sandbox/${encodeURIComponent(tr.dataset.id)}`;
    }
  });
  $("template-rows").addEventListener("click", (event) => {
    const tr = event.target.closest("tr[data-id]");
    if (tr) openBuild(tr.dataset.id, tr.dataset.build);
  });
  $("snap-next").addEventListener("click", () => {
    if (!snaps.next) return;
    snaps.tokens = snaps.tokens.slice(0, snaps.index + 1);
    snaps.tokens.push(snaps.next);
    snaps.index += 1;
    loadSnapshots();
  });
  $("snap-prev").addEventListener("click", () => {
    if (snaps.index === 0) return;
    snaps.index -= 1;
    loadSnapshots();
  });
  $("act-pause").addEventListener("click", pause);
  $("act-resume").addEventListener("click", resume);
  $("act-fork").addEventListener("click", fork);
  $("act-kill").addEventListener("click", askKill);
  $("kill-yes").addEventListener("click", kill);
  $("kill-no").addEventListener("click", () => { $("kill-confirm").hidden = true; });
  window.addEventListener("hashchange", route);
  window.addEventListener("unhandledrejection", (event) => report(event.reason));
  route();
  document.body.dataset.ready = "1";
}

document.addEventListener("DOMContentLoaded", start);
