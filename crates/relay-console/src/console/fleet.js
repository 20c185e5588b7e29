// The fleet page: one row per pipeline from /console/api/fleet (the fleet as it is at each
// request), refreshed every few seconds; each pipeline's name leads to its own console.
// Helpers: common.js.
"use strict";

let timer = null;

takeToken("");

// How a phase looks: fine, on its way, or needing someone.
const PHASE_CLASS = {
  streaming: "ok",
  starting: "warn", connecting: "warn", standby: "warn", retrying: "warn", draining: "warn",
  stopped: "bad", refused: "bad",
};

function since(unix) {
  if (!unix) return "–";
  const s = Math.max(0, Date.now() / 1000 - unix);
  return s < 90 ? s.toFixed(0) + " s" : s < 5400 ? (s / 60).toFixed(0) + " min" : (s / 3600).toFixed(1) + " h";
}

function number(v, digits) {
  return v === null || v === undefined ? "–" : Number(v).toFixed(digits);
}

function pipelineRow(p) {
  return h("tr", { "data-pipeline": p.name, "data-phase": p.phase },
    h("td", {}, h("a", { class: "pipeline-link", href: p.href + "#overview" }, p.name),
      h("div", { class: "muted" }, p.slot + " → " + p.stream)),
    h("td", {},
      h("span", { class: "badge state " + (PHASE_CLASS[p.phase] || "") }, p.phase),
      p.stop_kind ? h("span", { class: "muted" }, " " + p.stop_kind) : "",
      p.reason ? h("div", { class: "reason" + (p.phase === "stopped" || p.phase === "refused" ? " error" : "") }, p.reason) : ""),
    h("td", { class: "num since", title: p.since ? new Date(p.since * 1000).toISOString() : "" }, since(p.since)),
    h("td", { class: "num lag" }, bytes(p.slot_lag_bytes)),
    h("td", { class: "num events" }, p.events_published ?? "–"),
    h("td", { class: "num rate" }, number(p.events_per_second, 1)),
    h("td", { class: "num latency" }, number(p.commit_to_ack_ms, 1)),
    h("td", { class: "last-error" },
      p.last_error && p.last_error !== p.reason ? h("div", { class: "error" }, p.last_error) : "",
      p.reload_error ? h("div", { class: "error reload-error" }, "reload refused: " + p.reload_error) : "",
      !p.last_error && !p.reload_error ? "–" : ""));
}

async function fleet() {
  const data = await request("/console/api/fleet");
  const ready = data.pipelines.filter((p) => p.ready).length;
  const state = document.getElementById("fleet-state");
  state.textContent = ready + " of " + data.pipelines.length + " ready";
  state.className = "badge " + (data.ready ? "ok" : "bad");
  show(
    h("h2", {}, "Pipelines"),
    h("p", { class: "muted" }, "Each pipeline is one database, slot and stream. Events/s and commit to ack: the last 10 s sample of the events acknowledged."),
    h("table", { id: "pipelines" },
      h("thead", {}, h("tr", {}, ["pipeline", "state", "since", "slot lag", "events published", "events/s", "commit to ack (ms)", "last error"].map((t) => h("th", {}, t)))),
      h("tbody", {}, data.pipelines.map(pipelineRow))),
    data.pipelines.length ? "" : h("p", { class: "muted" }, "No pipelines."),
  );
}

async function refresh() {
  clearTimeout(timer);
  try {
    await fleet();
    document.body.dataset.view = "fleet";
    document.body.dataset.loaded = "true";
  } catch (e) {
    fail(e);
    document.body.dataset.loaded = "error";
  }
  timer = setTimeout(refresh, REFRESH_MS);
}

refresh();
