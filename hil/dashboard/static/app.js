// hil dashboard page: one websocket of frames (hil/dashboard/sampler.py), uPlot for time series,
// plain canvas for heat maps, bars and the lateness histogram. No framework, no CDN.
"use strict";
const KEEP = 600;            // points kept per time series (60 s at 10 Hz)
const HEAT_ROWS = 120;       // rows kept in a heat map
const COLORS = ["#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#7f7f7f"];  // red is for limits
const $ = (id) => document.getElementById(id);
let hello = null, csrf = null, frames = 0, lastStep = null;  // panels take a point per new loop step only
const panels = [];

function fmt(v, d = 3) { return v === null || v === undefined ? "-" : (typeof v === "number" ? +v.toPrecision(d) : v); }
function li(list, text, cls) { const e = document.createElement("li"); e.textContent = text; if (cls) e.className = cls; list.appendChild(e); }

// ---- panels ----
function padded(_u, min, max) {  // a flat signal (50 Hz held) gets a narrow band around it, not 0..100
  if (min === null || max === null) return [0, 1];
  const span = max - min, pad = span > 0 ? span * 0.1 : Math.max(Math.abs(max) * 0.002, 1e-9);
  return [min - pad, max + pad];
}

function linesPanel(p, box) {
  // one y scale per unit (at most two axes: left and right); setpoints and limits on their signal's scale
  const units = [...new Set(p.series.map((s) => s.unit))], unitOf = (n) => (p.series.find((s) => s.name === n) || p.series[0]).unit;
  const series = [{}], fixed = [];
  p.series.forEach((s, i) => series.push({ label: `${s.name} (${s.unit})`, stroke: COLORS[i % COLORS.length], width: 1.5, scale: s.unit }));
  p.setpoints.forEach((s) => { series.push({ label: `setpoint ${s.name} ${s.value}`, stroke: "#444", dash: [6, 4], scale: unitOf(s.name) }); fixed.push(s.value); });
  const lims = p.band ? p.band.map((v, i) => ({ value: v, label: i ? "band high" : "band low" })) : p.limits;
  lims.forEach((l) => { series.push({ label: l.label, stroke: "#c33", dash: [2, 3], scale: p.series[0].unit }); fixed.push(l.value); });
  const scales = { x: { time: false } }; units.forEach((u) => { scales[u] = { auto: true, range: padded }; });
  const axes = [{ label: "simulated s" }].concat(units.slice(0, 2).map((u, i) => ({ scale: u, label: u, side: i ? 1 : 3, grid: { show: i === 0 }, size: 60,
    values: (_u, vals) => vals.map((v) => +v.toPrecision(3)) })));
  const data = series.map(() => []);
  const plot = new uPlot({ width: 600, height: 220, series, scales, axes, legend: { live: false } }, data, box);
  return { p, plot, data, fixed, update(f) {
    data[0].push(f.t_s);
    p.series.forEach((s, i) => data[i + 1].push(f[s.source][s.index]));
    fixed.forEach((v, j) => data[p.series.length + 1 + j].push(v));
    if (data[0].length > KEEP) data.forEach((a) => a.shift());
    plot.setData(data);
  } };
}

function heatColor(v, lo, hi) {
  if (v === null) return "#000";
  const x = Math.max(0, Math.min(1, (v - lo) / (hi - lo)));
  return `hsl(${240 - 240 * x}, 80%, ${x < 0.001 || x > 0.999 ? 35 : 50}%)`;  // blue low .. red high
}

function heatPanel(p, box) {
  const c = document.createElement("canvas"); c.width = 600; c.height = 240; box.appendChild(c);
  const lo = p.band ? p.band[0] : p.series[0].low, hi = p.band ? p.band[1] : p.series[0].high;
  const note = document.createElement("div"); note.className = "dim";
  note.textContent = `${p.series.length} elements across, newest row at the bottom; colour ${lo}..${hi} ${p.series[0].unit} (blue..red, dark = outside)`;
  box.appendChild(note);
  const rows = [];
  return { p, update(f) {
    rows.push(p.series.map((s) => f[s.source][s.index])); if (rows.length > HEAT_ROWS) rows.shift();
    const g = c.getContext("2d"), w = c.width / p.series.length, h = c.height / HEAT_ROWS;
    g.clearRect(0, 0, c.width, c.height);
    rows.forEach((r, k) => r.forEach((v, i) => { g.fillStyle = heatColor(v, lo, hi); g.fillRect(i * w, c.height - (rows.length - k) * h, Math.ceil(w), Math.ceil(h)); }));
  } };
}

function barsPanel(p, box) {
  const c = document.createElement("canvas"); c.width = 600; c.height = 220; box.appendChild(c);
  const hi = p.band ? p.band[1] : null;
  return { p, update(f) {
    const vals = p.series.map((s) => f[s.source][s.index] ?? 0);
    const top = Math.max(hi ?? 0, ...vals) * 1.1 || 1, g = c.getContext("2d"), w = c.width / vals.length;
    g.clearRect(0, 0, c.width, c.height);
    vals.forEach((v, i) => { g.fillStyle = hi !== null && v > hi ? "#c33" : "#1f77b4"; const bh = c.height * v / top; g.fillRect(i * w, c.height - bh, Math.max(1, w - 1), bh); });
    if (hi !== null) { g.strokeStyle = "#c33"; g.setLineDash([4, 3]); g.beginPath(); g.moveTo(0, c.height * (1 - hi / top)); g.lineTo(c.width, c.height * (1 - hi / top)); g.stroke(); g.setLineDash([]); }
    g.fillStyle = "#222"; g.fillText(`max ${fmt(Math.max(...vals))} ${p.series[0].unit}` + (hi !== null ? `, limit ${hi}` : ""), 6, 12);
  } };
}

function addPanel(p) {
  const box = document.createElement("div"); box.className = "panel";
  const h = document.createElement("h3"); h.textContent = p.title; box.appendChild(h);
  if (p.kind === "lines" && p.series.length) {
    const b = document.createElement("div"); b.className = "dim";
    b.textContent = "physical bounds: " + [...new Set(p.series.map((s) => `${s.name} ${s.low ?? "-inf"}..${s.high ?? "inf"} ${s.unit}`))].slice(0, 4).join("; ");
    box.appendChild(b);
  }
  $("panels").appendChild(box);
  panels.push(p.kind === "heatmap" ? heatPanel(p, box) : p.kind === "bars" ? barsPanel(p, box) : linesPanel(p, box));
}

function resolve(name) {  // a chosen signal: an output/input name, or an array group (bus.vm -> every bus's vm)
  const out = [], add = (src, i) => out.push({ name: hello.names[src][i], source: src, index: i, unit: hello.units[src][i], low: null, high: null });
  for (const src of ["y", "u"]) {
    const g = hello.groups[src][name];
    if (g) for (let i = g[0]; i < g[0] + g[1]; i++) add(src, i);
    else hello.names[src].forEach((n, i) => { if (n === name) add(src, i); });
  }
  return out;
}

// ---- cards ----
function histogram(buckets) {
  const c = $("hist"), g = c.getContext("2d"); g.clearRect(0, 0, c.width, c.height);
  if (!buckets || !buckets.length) { g.fillText("no lateness samples (lockstep runs have none)", 6, 14); return; }
  const xs = buckets.map((b) => Math.log10(Math.max(b[0], 0.1))), x0 = Math.min(...xs), x1 = Math.max(...xs) + 0.05;
  const top = Math.max(...buckets.map((b) => b[1]));
  buckets.forEach((b, i) => { const x = 4 + (c.width - 8) * (xs[i] - x0) / (x1 - x0 || 1), h = (c.height - 16) * Math.log1p(b[1]) / Math.log1p(top);
    g.fillStyle = "#1f77b4"; g.fillRect(x, c.height - 12 - h, 3, h); });
  g.fillStyle = "#222"; g.fillText(`${fmt(10 ** x0)} us`, 2, c.height - 1); g.fillText(`${fmt(10 ** x1)} us`, c.width - 60, c.height - 1);
}

function cards(f) {
  $("state").textContent = f.loop_state; $("state").className = "pill " + f.loop_state.split(" ")[0];
  $("t_sim").textContent = fmt(f.t_s, 6); $("step").textContent = f.step; $("frames").textContent = ++frames;
  if (f.campaign) { campaign(f.campaign); return; }
  const st = f.stats || {};
  $("overruns").textContent = fmt(st.overruns); $("late_steps").textContent = fmt(st.late_steps);
  $("p99").textContent = fmt(st.lateness_p99_us); $("wall").textContent = fmt(st.wall_time_s, 4);
  histogram(st.lateness_hist_us);
  const al = $("alarms"); al.replaceChildren();
  (st.alarms || []).forEach((a) => li(al, `loop: ${a}`, "alarm"));
  const s = f.safety;
  if (s) {
    $("mode").textContent = s.mode; $("source").textContent = s.source ?? "-"; $("version").textContent = s.version ?? "none";
    $("fallback").textContent = s.fallback_active ? `ACTIVE (${s.fallback_reason})` : "off";
    $("gate").textContent = s.gate.mode ? `gate ${s.gate.mode} -> ${s.gate.target}: ${s.gate.passed ? "passes" : "refuses: " + s.gate.reasons.join("; ")}` : "";
    s.alarms.forEach((a) => li(al, `safety t=${fmt(a.t_s, 6)} s ${a.message}` + (a.acknowledged_by ? ` (acknowledged by ${a.acknowledged_by})` : ""), a.acknowledged_by ? "acked" : "alarm"));
  } else { $("mode").textContent = "no safety process"; }
  if (!al.children.length) li(al, "none");
  const d = f.decisions, ev = $("events"); ev.replaceChildren();
  const sh = st.shield;  // [safety] placement = "loop": the loop's shield decides every step, the safety supervises
  if (sh) {
    $("sources").textContent = "shield in the loop, steps by source: " + Object.entries(sh.steps).filter(([, v]) => v).map(([k, v]) => `${k} ${v}`).join(", ") + `; supervisor: policy ${sh.supervisor.allow_policy ? "may act" : "may not act"}${sh.supervisor.silent ? " (SILENT)" : ""}`;
    $("source").textContent = sh.last_source;
  } else {
    $("sources").textContent = Object.keys(d.sources).length ? "applied actions by source: " + Object.entries(d.sources).map(([k, v]) => `${k} ${v}`).join(", ") : "";
  }
  d.events.slice().reverse().forEach((e) => li(ev, `t=${fmt(e.t_s, 6)} s ${e.event}: ${e.reason}`));
  if (!ev.children.length) li(ev, hello.has_safety ? "no events yet" : "no decision log (no safety process)");
}

function campaign(c) {  // `hil campaign run`: progress.json (hil/campaign/runner.py CampaignProgress)
  $("camp-bar").max = c.total || 1; $("camp-bar").value = c.done || 0;
  $("camp-text").textContent = `${c.done ?? 0} / ${c.total ?? "?"} runs: ${c.pass ?? 0} pass, ${c.fail ?? 0} fail; ${fmt(c.elapsed_s, 4)} s elapsed (${c.state ?? "waiting"})`;
  const ul = $("camp-latest"); ul.replaceChildren();
  (c.latest || []).forEach((r) => li(ul, `${r.run_id}: ${r.verdict}` + (r.failed && r.failed.length ? ` (${r.failed.join(", ")})` : "") + (r.error ? ` ${r.error}` : ""), r.verdict === "pass" ? "" : "alarm"));
}

// ---- operator ----
function msg(text, good) { const m = $("login-msg"); m.textContent = text; m.className = "msg " + (good ? "good" : "bad"); }
function loggedIn(on) { $("login-form").hidden = on; $("actions").hidden = !on; }

async function login(ev) {
  ev.preventDefault();
  const r = await fetch("/api/login", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ password: $("login-password").value }) });
  const j = await r.json(); $("login-password").value = "";
  if (j.ok) { csrf = j.csrf; loggedIn(true); msg("logged in: operator actions enabled", true); } else msg(`refused: ${j.error}`, false);
}

async function action(op) {
  const body = { op, reason: "from the dashboard" }; if (op === "demote") body.to = $("demote-to").value;
  const r = await fetch("/api/action", { method: "POST", headers: { "Content-Type": "application/json", "X-HIL-CSRF": csrf || "" }, body: JSON.stringify(body) });
  const j = await r.json();
  if (r.status === 401) { loggedIn(false); csrf = null; }
  const what = j.changed === false ? `(unchanged: mode ${j.mode}; a demotion never raises the mode)` : j.mode ? `mode ${j.mode}` : j.version !== undefined ? `policy ${j.version}` : j.acknowledged !== undefined ? `${j.acknowledged} alarm(s) acknowledged` : "";
  msg(j.ok ? `${op}: done ${what}` : `${op} refused: ${j.error || (j.gate ? j.gate.reasons.join("; ") : "")}`, j.ok);
}

// ---- start ----
async function start() {
  hello = await (await fetch("/api/layout")).json();
  $("scenario").textContent = hello.scenario; $("plant").textContent = hello.campaign ? "" : `plant ${hello.plant}` + (hello.lockstep ? ", lockstep" : `, period ${fmt(hello.period_s * 1e3)} ms`);
  if (hello.campaign) { document.querySelectorAll(".run-only").forEach((e) => { e.hidden = true; }); $("campaign-card").hidden = false; }
  hello.panels.forEach(addPanel);
  if (!hello.auth_enabled) { $("login-form").hidden = true; msg("read-only: the dashboard was started without an operator password", false); }
  $("login-form").addEventListener("submit", login);
  for (const op of ["promote", "demote", "rollback", "acknowledge"]) $(`op-${op}`).addEventListener("click", () => action(op));
  $("logout-button").addEventListener("click", async () => { await fetch("/api/logout", { method: "POST" }); csrf = null; loggedIn(false); msg("logged out", true); });
  $("add-form").addEventListener("submit", (ev) => { ev.preventDefault(); const n = $("add-signal").value.trim(), s = resolve(n);
    $("add-msg").textContent = s.length ? "" : `${n}: no such output, input or group`; if (s.length) addPanel({ title: n, kind: "lines", series: s.slice(0, 12), setpoints: [], limits: [], band: null }); });
  const ws = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws`);
  ws.onmessage = (m) => { const f = JSON.parse(m.data);
    if (f.type === "reload") location.reload();
    else if (f.type === "error") $("state").textContent = f.message;
    else if (f.type === "frame") { cards(f); if (f.step !== lastStep && f.y) { lastStep = f.step; panels.forEach((p) => p.update(f)); } } };
  ws.onclose = () => { $("state").textContent = "disconnected"; $("state").className = "pill failed"; };
}
start();
