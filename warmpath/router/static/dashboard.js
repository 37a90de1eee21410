// warmpath dashboard: polls /v1/cluster and /v1/dashboard/state once a second and draws
// tables and hand-made SVG charts. No build step, no libraries, nothing outside the cluster.
// An API key (when the router has some) comes from the page's #key=... or localStorage.
"use strict";

const ROLE_ORDER = ["pre-prefill", "prefill", "decode", "replica"];
const CLASS_COLORS = { cold: "#3b7dd8", warm: "#d8893b", "turn2+": "#5aa05a" };
const SOURCE_COLORS = { L1: "#5aa05a", L2: "#3b7dd8", L3: "#8a5ad8", computed: "#d84b3b" };
const SVG = "http://www.w3.org/2000/svg";

function apiKey() {
  const m = location.hash.match(/key=([^&]+)/);
  if (m) localStorage.setItem("warmpathKey", decodeURIComponent(m[1]));
  return localStorage.getItem("warmpathKey");
}

async function getJSON(path) {
  const key = apiKey();
  const r = await fetch(path, { headers: key ? { Authorization: "Bearer " + key } : {}, cache: "no-store" });
  if (!r.ok) throw new Error(path + ": HTTP " + r.status);
  return r.json();
}

function fmt(key, v) {
  if (v === null || v === undefined) return "–";
  if (typeof v === "object") return JSON.stringify(v);
  if (typeof v !== "number") return String(v);
  if (/bytes_s$/.test(key)) return (v / 1e9).toFixed(2) + " GB/s";
  if (key === "kv_usage") return (100 * v).toFixed(1) + " %";
  if (Number.isInteger(v)) return String(v);
  return Math.abs(v) >= 100 ? v.toFixed(0) : v.toPrecision(3);
}

function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function renderWorkers(cluster, state) {
  const workers = [...cluster.workers].sort((a, b) =>
    ROLE_ORDER.indexOf(a.role) - ROLE_ORDER.indexOf(b.role) || a.worker_id.localeCompare(b.worker_id));
  const keys = [];
  for (const w of workers) for (const k of Object.keys(w)) if (!["worker_id", "role"].includes(k) && !keys.includes(k)) keys.push(k);
  const head = el("tr");
  for (const h of ["worker", "role", "health", "last heartbeat (s ago)", ...keys]) head.appendChild(el("th", {}, h));
  const thead = document.querySelector("#workers thead");
  thead.replaceChildren(head);
  const body = document.querySelector("#workers tbody");
  body.replaceChildren(...workers.map((w) => {
    const s = state.workers[w.worker_id] || {};
    const tr = el("tr", { class: "worker role-" + w.role, "data-worker": w.worker_id, "data-role": w.role });
    tr.appendChild(el("td", { class: "text" }, w.worker_id));
    tr.appendChild(el("td", { class: "text role" }, w.role));
    tr.appendChild(el("td", { class: "text health " + (s.health || "") }, s.health || "?"));
    tr.appendChild(el("td", {}, fmt("s", s.last_seen_s)));
    for (const k of keys) tr.appendChild(el("td", { "data-key": k }, fmt(k, w[k])));
    return tr;
  }));
  const log = document.getElementById("role-changes");
  if (state.role_changes.length)
    log.replaceChildren(...state.role_changes.map((c) => el("li", {},
      new Date(c.t * 1000).toLocaleTimeString() + ": " + c.worker + " " + c.from + " → " + c.to
      + (c.reason ? " (" + c.reason + ")" : ""))));
}

function renderRouters(cluster) {
  // every router of an active-active fleet (this one first) and whether their indexes agree
  const routers = cluster.routers || [];
  document.getElementById("routers-agree").textContent = routers.length > 1
    ? (cluster.routers_agree ? "agree" : "differ (converging)") : "one router";
  document.querySelector("#routers tbody").replaceChildren(...routers.map((r) => {
    const tr = el("tr", { class: "router" + (r.alive ? "" : " dead"), "data-router": r.url });
    const seqs = Object.entries(r.event_seqs).sort().map(([w, n]) => w + " " + n).join(", ");
    for (const v of [r.url + (r.self ? " (this one)" : ""), r.alive ? "yes" : "no", fmt("s", r.last_report_s ?? 0),
      String(r.in_flight), String(r.waiting), (r.index_blocks.local ?? 0) + ", " + (r.index_blocks.l3 ?? 0), seqs])
      tr.appendChild(el("td", { class: "text" }, v));
    return tr;
  }));
}

function lineChart(id, samples, series, yfmt) {
  const svg = document.getElementById(id);
  const W = svg.clientWidth || 400, H = svg.clientHeight || 160, L = 46, B = 16;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.replaceChildren();
  const t1 = samples.length ? samples[samples.length - 1].t : Date.now() / 1000;
  const t0 = Math.min(samples.length ? samples[0].t : t1, t1 - 60);
  let ymax = 0, points = 0;
  for (const s of series) for (const x of samples) { const v = s.get(x); if (v !== null && v !== undefined) ymax = Math.max(ymax, v); }
  ymax = ymax > 0 ? ymax * 1.1 : 1;
  const X = (t) => L + (W - L - 4) * (t - t0) / Math.max(1, t1 - t0), Y = (v) => H - B - (H - B - 6) * v / ymax;
  const line = (x1, y1, x2, y2) => { const l = document.createElementNS(SVG, "line");
    Object.entries({ x1, y1, x2, y2, class: "axis" }).forEach(([k, v]) => l.setAttribute(k, v)); svg.appendChild(l); };
  const text = (x, y, s, anchor) => { const e = document.createElementNS(SVG, "text");
    e.setAttribute("x", x); e.setAttribute("y", y); e.setAttribute("text-anchor", anchor || "end"); e.textContent = s; svg.appendChild(e); };
  line(L, H - B, W, H - B); line(L, 4, L, H - B);
  text(L - 3, 12, yfmt(ymax / 1.1)); text(L - 3, H - B, "0");
  text(L, H - 3, Math.round((t1 - t0) / 60) + " min ago", "start"); text(W - 2, H - 3, "now");
  for (const s of series) {
    let run = [];
    const flush = () => {
      if (run.length === 1) { const c = document.createElementNS(SVG, "circle");
        c.setAttribute("cx", run[0][0]); c.setAttribute("cy", run[0][1]); c.setAttribute("r", 2); c.setAttribute("fill", s.color); svg.appendChild(c); }
      else if (run.length > 1) { const p = document.createElementNS(SVG, "polyline");
        p.setAttribute("points", run.map((q) => q.join(",")).join(" ")); p.setAttribute("stroke", s.color);
        if (s.dash) p.setAttribute("stroke-dasharray", "4 3"); svg.appendChild(p); }
      run = [];
    };
    for (const x of samples) {
      const v = s.get(x);
      if (v === null || v === undefined) { flush(); continue; }
      run.push([X(x.t).toFixed(1), Y(v).toFixed(1)]); points++;
    }
    flush();
  }
  svg.dataset.points = points;
  const legend = document.getElementById(id.replace("chart", "legend"));
  legend.replaceChildren(...series.map((s) => { const sp = el("span", {}, s.name);
    const i = el("i"); i.style.background = s.color; sp.prepend(i); return sp; }));
}

function renderCharts(state) {
  const xs = state.samples, cls = Object.keys(CLASS_COLORS);
  document.getElementById("window").textContent = `(percentiles over the last ${state.window_s} s, one sample a second)`;
  const secs = (v) => v.toPrecision(2) + " s";
  lineChart("chart-ttft", xs, cls.flatMap((c) => [
    { name: c + " p50", color: CLASS_COLORS[c], get: (x) => x.classes[c].ttft_p50 },
    { name: c + " p90", color: CLASS_COLORS[c], dash: true, get: (x) => x.classes[c].ttft_p90 }]), secs);
  lineChart("chart-tpot", xs, cls.map((c) => ({ name: c, color: CLASS_COLORS[c], get: (x) => x.classes[c].tpot_p50 })), secs);
  lineChart("chart-admission", xs, [
    { name: "in flight", color: "#3b7dd8", get: (x) => x.in_flight },
    { name: "limit", color: "#3b7dd8", dash: true, get: (x) => x.limit },
    { name: "waiting", color: "#d8893b", get: (x) => x.waiting },
    { name: "429/s", color: "#d84b3b", get: (x) => x.rejected_s }], (v) => v.toFixed(1));
  const adm = state.admission;
  document.getElementById("admission-limit").textContent = `limit ${adm.max_in_flight}: ${adm.reason}`;
  lineChart("chart-sources", xs, Object.keys(SOURCE_COLORS).map((k) =>
    ({ name: k, color: SOURCE_COLORS[k], get: (x) => x.sources_s[k] })), (v) => v.toFixed(0));
  lineChart("chart-kv", xs, [{ name: "KV handoff", color: "#8a5ad8", get: (x) => x.kv_bytes_s / 1e6 }], (v) => v.toFixed(1));
  const tot = state.sources_total, all = Object.values(tot).reduce((a, b) => a + b, 0) || 1;
  document.getElementById("sources-total").replaceChildren(...Object.keys(SOURCE_COLORS).map((k) => {
    const d = el("div", { "data-source": k }), bar = el("i");
    bar.style.width = (300 * tot[k] / all).toFixed(0) + "px"; bar.style.background = SOURCE_COLORS[k];
    d.append(el("b", {}, k), bar, el("span", {}, tot[k] + " tokens")); return d;
  }));
}

function renderDecisions(state) {
  const body = document.querySelector("#decisions tbody");
  body.replaceChildren(...state.decisions.map((d) => {
    const tr = el("tr", { class: "decision" }), src = d.sources;
    const cells = [new Date(d.t * 1000).toLocaleTimeString(), d.cls, d.turn, d.path, d.prefill || "–", d.decode,
      d.ppd || "–", fmt("s", d.est_ttft_s), fmt("s", d.ttft_s), fmt("s", d.est_tpot_s), fmt("s", d.tpot_s),
      d.prompt_tokens + " / " + d.cached_tokens,
      src ? [src.L1, src.L2, src.L3, src.computed].join(" / ") : "–"];
    for (const c of cells) tr.appendChild(el("td", {}, String(c)));
    tr.appendChild(el("td", { class: "text reason" }, d.reason));
    return tr;
  }));
}

async function tick() {
  const status = document.getElementById("status");
  try {
    const [cluster, state] = await Promise.all([getJSON("/v1/cluster"), getJSON("/v1/dashboard/state")]);
    document.getElementById("policy").textContent = `policy ${cluster.policy}` + (cluster.ppd ? `, PPD ${cluster.ppd}` : "");
    renderWorkers(cluster, state);
    renderRouters(cluster);
    renderCharts(state);
    renderDecisions(state);
    status.textContent = "updated " + new Date().toLocaleTimeString();
    status.className = "status";
  } catch (e) {
    status.textContent = String(e.message || e);
    status.className = "status error";
  }
}

tick();
setInterval(tick, 1000);
