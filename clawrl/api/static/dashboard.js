// clawrl dashboard: polls /dashboard/state.json and redraws; charts are plain SVG.
// Every text from the server goes in with textContent (el() below), never innerHTML:
// prompts, answers and judge replies are untrusted.
"use strict";

const POLL_MS = 2000;
const SVG = "http://www.w3.org/2000/svg";

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== null && v !== undefined) node.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    node.append(c instanceof Node ? c : document.createTextNode(c === null || c === undefined ? "" : String(c)));
  }
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  return node;
}

function fill(id, ...children) {
  const node = document.getElementById(id);
  node.replaceChildren(...children.flat());
  return node;
}

function num(x, digits = 3) {  // fixed digits, trailing zeros of the fraction dropped
  if (x === null || x === undefined) return "–";
  const s = Number(x).toFixed(digits);
  return s.includes(".") ? s.replace(/\.?0+$/, "") : s;
}
const pct = (x) => (x === null || x === undefined ? "–" : `${Math.round(100 * x)}%`);
const when = (t) => (t ? new Date(t * 1000).toLocaleString() : "–");

function ago(t, now) {
  if (!t) return "";
  const s = Math.max(0, Math.round(now - t));
  if (s < 60) return `${s} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${(s / 3600).toFixed(1)} h ago`;
  return `${(s / 86400).toFixed(1)} days ago`;
}

function dl(pairs) {
  return pairs.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]);
}

function table(head, rows) {
  return [el("thead", {}, el("tr", {}, head.map((h) => el("th", {}, h)))), el("tbody", {}, rows)];
}

// ---- charts -------------------------------------------------------------------------------

const W = 520, H = 180, PAD = 30;

function frame(lo, hi, label) {
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": label });
  const y = (v) => H - PAD - ((v - lo) / (hi - lo || 1)) * (H - 2 * PAD);
  for (const v of [lo, (lo + hi) / 2, hi]) {
    root.append(svg("line", { x1: PAD, x2: W - 8, y1: y(v), y2: y(v), class: "grid" }));
    const t = svg("text", { x: PAD - 4, y: y(v) + 4, class: "axis", "text-anchor": "end" });
    t.textContent = num(v, 2);
    root.append(t);
  }
  return { root, y };
}

function empty(text) {
  return el("p", { class: "empty" }, text);
}

function bars(items, label) {  // items: [{name, value}], value in [-1, 1]
  if (!items.length) return empty("no judged turns yet");
  const { root, y } = frame(-1, 1, label);
  const step = (W - PAD - 8) / items.length;
  items.forEach((it, i) => {
    const x = PAD + i * step + step * 0.15, w = step * 0.7;
    const top = Math.min(y(it.value), y(0)), h = Math.abs(y(it.value) - y(0));
    root.append(svg("rect", { x, y: top, width: w, height: Math.max(h, 1), class: it.value >= 0 ? "pos" : "neg" }));
    const t = svg("text", { x: x + w / 2, y: H - 8, class: "axis", "text-anchor": "middle" });
    t.textContent = it.name;
    root.append(t);
  });
  return root;
}

function lines(series, lo, hi, label) {  // series: [{name, cls, points: [[t, v]]}]
  const all = series.flatMap((s) => s.points);
  if (!all.length) return empty("nothing yet");
  const { root, y } = frame(lo, hi, label);
  const t0 = Math.min(...all.map((p) => p[0])), t1 = Math.max(...all.map((p) => p[0]));
  const x = (t) => PAD + ((t - t0) / (t1 - t0 || 1)) * (W - PAD - 8);
  series.forEach((s, i) => {
    if (!s.points.length) return;
    const d = s.points.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" ");
    root.append(svg("polyline", { points: d, class: `line ${s.cls}` }));
    s.points.forEach((p) => root.append(svg("circle", { cx: x(p[0]), cy: y(p[1]), r: 2.5, class: s.cls })));
    const t = svg("text", { x: W - 10, y: 14 + 14 * i, class: `legend ${s.cls}`, "text-anchor": "end" });
    t.textContent = s.name;
    root.append(t);
  });
  return root;
}

// ---- the dashboard ------------------------------------------------------------------------

function counts(store) {
  if (!store) return [el("p", { class: "empty" }, "collection is off: nothing is recorded")];
  const c = store.counts, s = c.samples;
  const card = (name, value, note) => el("div", { class: "card", "data-count": name },
    el("div", { class: "value" }, value ?? 0), el("div", { class: "name" }, note || name));
  return [
    card("sessions", c.sessions), card("turns", c.turns), card("main", c.main, "main turns"),
    card("side", c.side, "side turns"), card("next_state", c.next_state, "with next state"),
    card("judged", c.judged), card("hinted", c.hinted, "hint accepted"),
    card("ready", s.ready, "samples ready"), card("trained", s.trained, "samples trained"),
    card("stale", s.stale, "samples stale"), card("skipped", s.skipped, skippedNote(c)),
    card("episodes", c.episodes), card("groups_used", (c.groups || {}).used, "groups used"),
    card("groups_dropped", (c.groups || {}).dropped, "groups dropped"),
    card("memory_injected", c.memory_injected, "prompts with memory"),
    card("memory_dropped", c.memory_dropped, "memory dropped (window)"),
    card("memory_samples", c.memory_samples, "memory distillation samples"),
    card("memory_distilled", c.memory_distilled, "experiences distilled"),
  ];
}

// Why samples were skipped ("samples skipped: 2 too long"), and a warning when nothing else came.
function skippedNote(c) {
  const why = Object.entries(c.skipped || {}).sort((a, b) => b[1] - a[1]).map(([r, n]) => `${n} ${r}`);
  const s = c.samples, none = !s.trained && !s.ready && !s.stale && s.skipped;
  return (why.length ? `samples skipped: ${why.join(", ")}` : "samples skipped") +
    (none ? " (every sample: nothing trains)" : "");
}

function render(st) {
  const now = st.now, store = st.store;
  fill("model", `model ${st.model} · method ${st.method}`);
  fill("served-version", st.served.version);
  fill("served-since", `since ${when(st.served.since)} (${ago(st.served.since, now)})`);
  fill("counts", counts(store));
  const versions = store ? store.versions.slice().reverse() : [];
  const byVersion = versions.filter((v) => v.served && v.served.mean_score !== null)
    .map((v) => ({ name: v.name, value: v.served.mean_score }));
  fill("reward-version", bars(byVersion, "mean judge score of the turns each version served"));
  const overTime = store ? store.reward_over_time : [];
  fill("reward-time", lines([
    { name: "mean score", cls: "score", points: overTime.filter((r) => r.mean_score !== null).map((r) => [r.t, r.mean_score]) },
    { name: "hint acceptance", cls: "hint", points: overTime.filter((r) => r.hint_rate !== null).map((r) => [r.t, r.hint_rate]) },
  ], -1, 1, "judged turns by minute"));
  renderTrainer(st.trainer, versions, now);
  renderJudge(st.judge);
  renderEngine(st.engine);
  renderUsers(store ? store.users || [] : []);
  renderVersions(store ? store.versions : [], now);
  renderGroups(store ? store.groups : [], now);
  renderExperiences(store ? store.experiences || [] : [], now);
  renderSessions(store ? store.sessions : [], now);
  fill("live", `live · updated ${new Date(now * 1000).toLocaleTimeString()}`).className = "live ok";
}

function renderTrainer(t, versions, now) {
  const l = t.latest || {};
  fill("trainer", dl([
    ["status", t.status], ["restarts", t.restarts ?? "–"], ["batch size", t.batch_size ?? "–"],
    ["latest", l.version ? `${l.version} (${ago(l.created_at, now)})` : "no step yet"],
    ["step", l.step ?? "–"], ["loss", num(l.loss, 4)], ["KL", num(l.kl, 4)],
    ["tokens/s", `${num(l.tokens_per_s, 0)} answer, ${num(l.processed_tokens_per_s, 0)} processed`],
    ["mismatch", `${num(l.mismatch, 4)} (exact ${num(l.mismatch_exact, 4)}, stale ${num(l.mismatch_stale, 4)}, processed ${num(l.mismatch_processed, 4)}, conditioned ${num(l.mismatch_conditioned, 4)})`],
    ["IS weight", l.is_weight_mean == null ? "–" : `mean ${num(l.is_weight_mean, 3)}, min ${num(l.is_weight_min, 3)}`],
    ["truncated", l.is_truncated_frac == null ? "–" : `${pct(l.is_truncated_frac)} of tokens, ${l.is_truncated_samples ?? 0} samples`],
  ]));
  const trained = versions.filter((v) => v.metrics.loss !== undefined && v.metrics.loss !== null);
  fill("loss-chart", trained.length < 2 ? [] : lines([
    { name: "loss", cls: "score", points: trained.map((v) => [v.step, v.metrics.loss]) },
  ], Math.min(0, ...trained.map((v) => v.metrics.loss)), Math.max(...trained.map((v) => v.metrics.loss)), "loss by step"));
}

function renderJudge(j) {
  if (j.status === "off") return fill("judge", dl([["status", "off"]]));
  const votes = Object.entries(j.votes || {}).map(([k, n]) => `${k} ${n}`).join(", ") || "none yet";
  fill("judge", dl([
    ["status", j.status], ["judge", j.judge], ["turns judged", j.judged], ["queued", j.queued],
    ["in flight", j.in_flight], ["failed votes", j.failed_votes],
    ["mean latency", j.latency_s === null ? "–" : `${num(j.latency_s, 2)} s`], ["votes", votes],
    ["last error", j.last_error || "none"],
  ]));
}

function renderEngine(e) {
  const cache = (e.extra || {}).prefix_cache;
  fill("engine", dl([
    ["batch", `${e.active} active / ${e.max_batch_size}, ${e.waiting} waiting`],
    ["tokens generated", e.tokens_generated], ["requests", `${e.requests_finished} finished, ${e.requests_cancelled} cancelled`],
    ["prefix cache", cache ? `${cache.hits}/${cache.lookups} hits, ${cache.hit_tokens} tokens reused` : "off"],
  ]));
}

// "0.5123 (−0.4%) KL 0.0123", and why it was held; "–" when no canary ran.
function canaryText(c) {
  if (!c) return "–";
  const drop = c.drop == null ? "" : ` (${c.drop > 0 ? "−" : "+"}${Math.abs(100 * c.drop).toFixed(1)}%)`;
  const text = `${num(c.score, 4)}${drop} KL ${c.kl == null ? "–" : num(c.kl, 4)}`;
  return c.reason ? `${text}: ${c.reason}` : text;
}

// The canary's collapse figures (clawrl/guard/collapse.py): "H 0.92× · self-ROUGE-L 0.31 · drift 0.12",
// with "collapse: entropy, drift" after them when a limit was crossed; "–" when none were measured.
function collapseText(c) {
  const f = (c || {}).collapse;
  if (!f) return ["–", false];
  const ratio = f.entropy_ratio == null ? "–" : `${num(f.entropy_ratio, 2)}×`;
  const text = `H ${ratio} · self-ROUGE-L ${num(f.self_rouge_l, 2)} · drift ${num(f.drift, 2)}`;
  const crossed = f.crossed || [];
  return [crossed.length ? `${text}: collapse: ${crossed.join(", ")}` : text, crossed.length > 0];
}

function renderVersions(versions, now) {
  const rows = versions.map((v) => {
    const m = v.metrics || {}, s = v.served || {}, canary = canaryText(v.canary);
    const [collapse, collapsing] = collapseText(v.canary);
    return el("tr", { "data-version": v.name, class: v.status === "held" ? "held" : "" },
      el("td", {}, v.name), el("td", {}, v.step), el("td", {}, ago(v.created_at, now)), el("td", {}, v.status),
      el("td", {}, m.samples ?? "–"), el("td", {}, num(m.loss, 4)), el("td", {}, num(m.kl, 4)),
      el("td", {}, num(m.mismatch_exact, 4)), el("td", {}, num(m.tokens_per_s, 0)), el("td", {}, num(m.mean_reward, 2)),
      el("td", {}, s.judged ?? 0), el("td", {}, num(s.mean_score, 2)), el("td", {}, pct(s.hint_rate)),
      el("td", {}, canary), el("td", { class: collapsing ? "collapse" : "" }, collapse));
  });
  fill("versions", table(["version", "step", "published", "status", "samples", "loss", "KL", "mismatch exact", "tokens/s",
    "train reward", "turns judged", "served score", "hints", "canary", "collapse"], rows));
}

// Track 2: G episodes of one task; used (its samples), dropped (why), eval, or still open.
function renderGroups(groups, now) {
  if (!groups.length) return fill("groups", table(["group"], [el("tr", {}, el("td", {}, "no episodes yet (clawrl envs)"))]));
  const rows = groups.map((g) => el("tr", { "data-group": g.id },
    el("td", {}, g.id), el("td", {}, [g.env, g.task].filter(Boolean).join(" ") || "–"),
    el("td", {}, `${g.received}/${g.size}`), el("td", {}, g.status), el("td", {}, g.reason || ""),
    el("td", {}, num(g.reward_mean, 3)), el("td", {}, num(g.reward_std, 3)), el("td", {}, g.samples),
    el("td", {}, ago(g.created_at, now))));
  fill("groups", table(["group", "env / task", "episodes", "status", "reason", "mean reward", "std", "samples",
    "started"], rows));
}

// Users (docs/users.md): shown with `server.users` only; a user's key sees its own row.
function renderUsers(users) {
  document.getElementById("users-panel").hidden = !users.length;
  const rows = users.map((u) => el("tr", { "data-user": u.user },
    el("td", {}, u.user), el("td", {}, u.served), el("td", {}, u.turns), el("td", {}, u.ready),
    el("td", {}, u.trained), el("td", {}, u.skipped), el("td", {}, u.versions), el("td", {}, u.held),
    el("td", {}, u.memory)));
  fill("users", table(["user", "served", "turns", "samples ready", "trained", "skipped", "versions", "held",
    "memory items"], rows));
}

// Memory (docs/memory.md): each experience with its provenance, the sessions that taught it linked.
function renderExperiences(experiences, now) {
  if (!experiences.length) return fill("experiences", table(["experience"], [el("tr", {}, el("td", {}, "nothing learnt yet"))]));
  const link = (id) => el("a", { href: `/dashboard/session?id=${encodeURIComponent(id)}` }, id);
  const rows = experiences.map((e) => el("tr", { "data-experience": e.id },
    el("td", {}, `#${e.id}`), el("td", {}, e.text), el("td", {}, e.state), el("td", {}, e.seen),
    el("td", {}, ago(e.last_seen, now)), el("td", {}, e.gap == null ? "" : num(e.gap, 3)),
    el("td", {}, ...e.session_ids.slice(-3).flatMap((s, i) => (i ? [", ", link(s)] : [link(s)]))),
    el("td", {}, e.turn_ids.length)));
  fill("experiences", table(["id", "experience", "state", "seen", "last seen", "gap", "from sessions", "turns"], rows));
}

function renderSessions(sessions, now) {
  const rows = sessions.map((s) => el("tr", {},
    el("td", {}, el("a", { href: `/dashboard/session?id=${encodeURIComponent(s.id)}` }, s.id)),
    el("td", {}, s.source), el("td", {}, s.turns), el("td", {}, s.main_turns), el("td", {}, num(s.mean_score, 2)),
    el("td", {}, ago(s.updated_at, now)), el("td", {}, s.ended_at ? s.end_reason : "open")));
  fill("sessions", table(["session", "source", "turns", "main", "mean score", "active", "state"], rows));
}

async function poll() {
  try {
    const r = await fetch("/dashboard/state.json", { cache: "no-store", credentials: "same-origin" });
    if (r.status === 401) { location.reload(); return; }
    if (!r.ok) throw new Error(`HTTP ${r.status}`);
    render(await r.json());
  } catch (err) {
    fill("live", `disconnected (${err.message}); retrying`).className = "live bad";
  }
  setTimeout(poll, POLL_MS);
}

// ---- one session --------------------------------------------------------------------------

function content(m) {
  if (typeof m.content === "string") return m.content;
  if (Array.isArray(m.content)) return m.content.map((p) => p.text ?? `[${p.type}]`).join("\n");
  return "";
}

function message(m) {
  const calls = (m.tool_calls || []).map((c) => `→ ${c.function?.name}(${c.function?.arguments})`);
  return el("div", { class: `msg ${m.role}` }, el("span", { class: "role" }, m.role),
    el("pre", {}, [content(m), ...calls].filter(Boolean).join("\n")));
}

function judgment(j) {
  if (!j) return el("p", { class: "empty" }, "not judged");
  const votes = j.votes.map((v) => el("li", {}, el("strong", {}, `${v.kind} ${v.value ?? "failed"}`),
    ` (${num(v.latency_s, 2)} s) `, el("pre", {}, v.raw ?? v.error ?? "")));
  return el("div", { class: "judgment" }, el("p", {}, `score ${j.score ?? "–"} · judge ${j.judge}`),
    j.hint ? el("p", { class: "hint" }, "hint: ", el("q", {}, j.hint)) : "", el("ul", {}, votes));
}

// How the next state was matched to the answer (NextStateMatch in clawrl/types.py), where it matters.
function nextStateTitle(match) {
  if (match === "rewritten") return "next state (the client resent this answer rewritten)";
  if (match === "named") return "next state (the session named, its history changed)";
  return "next state";
}

function turn(t) {
  return el("article", { class: `turn ${t.type}` },
    el("h3", {}, `#${t.index} ${t.type} · ${t.versions.join(", ")} · ${t.finish_reason} · ${when(t.created_at)}`),
    t.new_messages.map(message),
    message({ role: "assistant", content: t.response, tool_calls: t.tool_calls }),
    t.next_state ? el("details", {}, el("summary", {}, nextStateTitle(t.next_state_match)), t.next_state.map(message)) : "",
    judgment(t.judgment));
}

async function showSession() {
  const id = new URLSearchParams(location.search).get("id") || "";
  fill("session-id", id);
  const r = await fetch(`/dashboard/session.json?id=${encodeURIComponent(id)}`, { credentials: "same-origin" });
  if (!r.ok) return fill("turns", el("p", { class: "empty" }, `no such session (HTTP ${r.status})`));
  const s = await r.json();
  fill("session-meta", `${s.source} · started ${when(s.created_at)} · ${s.ended_at ? `ended (${s.end_reason})` : "open"}`);
  fill("turns", s.turns.map(turn));
}

if (document.body.dataset.page === "session") showSession(); else poll();
