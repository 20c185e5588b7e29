// One relay's console: one page, views chosen by the address's #fragment, data from the JSON
// under the page's base (`/console/api/`; a fleet pipeline's `/console/p/<name>/api/`), which
// the server writes into the page. Helpers: common.js.
"use strict";

const BASE = document.body.dataset.base || "/console/";
const READY = document.body.dataset.ready || "/readyz";
let timer = null;

takeToken("#overview");

function api(path, payload) {
  return request(BASE + "api/" + path, payload);
}

function card(label, value, id) {
  return h("div", { class: "card" }, h("dt", {}, label), h("dd", { id }, value ?? "–"));
}

// A line chart of `points` ([x, y]) as SVG, with its newest value as the caption.
function chart(title, points, unit, id) {
  const svgNs = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(svgNs, "svg");
  svg.setAttribute("viewBox", "0 0 400 120");
  svg.setAttribute("preserveAspectRatio", "none");
  const ys = points.map((p) => p[1]);
  const max = Math.max(1e-9, ...ys);
  if (points.length > 1) {
    const x0 = points[0][0];
    const span = Math.max(1, points[points.length - 1][0] - x0);
    const line = document.createElementNS(svgNs, "polyline");
    line.setAttribute("points", points
      .map(([x, y]) => ((x - x0) / span * 400).toFixed(1) + "," + (115 - y / max * 105).toFixed(1))
      .join(" "));
    svg.append(line);
  }
  const last = points.length ? points[points.length - 1][1] : null;
  const caption = last === null ? "no samples yet (one every 10 s)" :
    "now " + last.toFixed(1) + " " + unit + ", peak " + max.toFixed(1) + " " + unit + " (" + points.length + " samples)";
  return h("div", { class: "chart", id }, h("h3", {}, title), svg, h("div", { class: "muted" }, caption));
}

async function overview() {
  const data = await api("overview");
  const s = data.status;
  const pg = s.postgres;
  const slot = pg.slot_state || {};
  const p = s.pipeline;
  const history = data.history || [];
  show(
    h("h2", {}, "Overview"),
    s.reasons.length ? h("p", { class: "error", id: "reasons" }, "Not ready: " + s.reasons.join("; ")) : "",
    h("dl", { class: "cards" },
      card("Slot", pg.slot, "slot"),
      card("Streaming", pg.streaming ? "yes" : "no", "streaming"),
      card("Checkpoint (stored, confirmed)", pg.checkpoint_lsn, "checkpoint-lsn"),
      card("Slot confirmed_flush_lsn", slot.confirmed_flush_lsn, "slot-lsn"),
      card("Slot lag", bytes(slot.lag_bytes), "slot-lag"),
      card("Last acknowledged commit", ago(p.last_acked_commit_time), "last-commit"),
      card("Stream", s.nats.stream + " · last seq " + (s.nats.stream_last_sequence ?? "–"), "stream"),
      card("Events published", p.events_published, "events-published"),
      card("Duplicates acknowledged", p.duplicates_acknowledged, "duplicates"),
      card("Outstanding acks", p.outstanding_acks, "outstanding"),
      card("Publish retries", p.publish_retries, "retries"),
      card("Reconnects (PostgreSQL, NATS)", pg.reconnects + ", " + s.nats.reconnects, "reconnects"),
    ),
    pg.last_error ? h("p", { class: "error", id: "last-error" }, "Last error: " + pg.last_error) : "",
    h("div", { class: "charts" },
      chart("Events per second, last hour", history.map((x) => [x.at, x.events_per_second]), "ev/s", "chart-rate"),
      chart("Commit to ack, mean, last hour", history.filter((x) => x.commit_to_ack_ms !== null).map((x) => [x.at, x.commit_to_ack_ms]), "ms", "chart-latency"),
      chart("Slot lag, last hour", history.filter((x) => x.slot_lag_bytes !== null).map((x) => [x.at, x.slot_lag_bytes / 1024]), "KiB", "chart-lag"),
    ),
  );
}

function headerTable(headers) {
  return h("table", {}, h("tbody", {}, headers.map(([k, v]) => h("tr", {}, h("th", {}, k), h("td", {}, h("code", {}, v))))));
}

function header(m, name) {
  const found = m.headers.find(([k]) => k === name);
  return found ? found[1] : "";
}

async function events(subject) {
  const query = "events?limit=50" + (subject ? "&subject=" + encodeURIComponent(subject) : "");
  const data = await api(query);
  const input = h("input", { id: "subject-filter", placeholder: "subject filter, e.g. outbox.Order.>", value: subject || "" });
  const form = h("form", { class: "toolbar", onsubmit: (e) => { e.preventDefault(); location.hash = "events/" + encodeURIComponent(input.value.trim()); } },
    input, h("button", { type: "submit" }, "Filter"),
    h("span", { class: "muted", id: "searched" }, "read sequences " + data.searched[0] + "–" + data.searched[1] + " of " + data.stream_last));
  show(
    h("h2", {}, "Events"),
    form,
    h("table", { id: "events" },
      h("thead", {}, h("tr", {}, h("th", {}, "seq"), h("th", {}, "subject"), h("th", {}, "event id"), h("th", {}, "stored"), h("th", {}, "payload"))),
      h("tbody", {}, data.messages.map((m) => h("tr", {},
        h("td", { class: "num" }, h("a", { href: "#event/" + m.seq }, m.seq)),
        h("td", {}, m.subject),
        h("td", {}, h("code", {}, header(m, "Nats-Msg-Id"))),
        h("td", {}, m.stored_at),
        h("td", {}, h("code", {}, m.payload)))))),
    data.messages.length ? "" : h("p", { class: "muted" }, "No messages."),
  );
}

async function oneEvent(seq) {
  const m = await api("message/" + encodeURIComponent(seq));
  const id = header(m, "Nats-Msg-Id");
  show(
    h("h2", {}, "Message " + m.seq),
    h("p", {}, m.subject + " · stored " + m.stored_at + " · " + m.payload_bytes + " bytes · ",
      id ? h("a", { href: "#trace/" + encodeURIComponent(id), id: "trace-link" }, "trace " + id) : ""),
    headerTable(m.headers),
    h("h3", {}, "Payload"),
    h("pre", { id: "payload" }, m.payload),
  );
}

// Asks the relay to publish dead letters again (their rows as the table holds them now) and
// says which signals carry it out.
async function republish(body, button) {
  const result = document.getElementById("republish-result");
  button.disabled = true;
  try {
    const r = await api("dead-letters/republish", body);
    result.className = "";
    result.replaceChildren(
      ...r.signals.map((x) => h("span", {}, "Signal ", h("a", { href: "#backfills", class: "signal-link" }, String(x.id)),
        " re-publishes " + x.rows + " row(s) of " + x.table + ". ")),
      ...r.skipped.map((x) => h("span", { class: "error" }, "Skipped: " + x + ". ")));
  } catch (e) {
    result.className = "error";
    result.textContent = String(e.message || e);
  } finally {
    button.disabled = false;
  }
}

// Asks the relay for a signal (a backfill or a replay) and names it in `result`.
async function askSignal(kind, args, button, result) {
  button.disabled = true;
  try {
    const r = await api("signals", { kind, args });
    result.className = "";
    result.replaceChildren("Signal ", h("a", { href: "#backfills", class: "signal-link" }, String(r.id)),
      " requested: its progress and outcome are under Backfills.");
  } catch (e) {
    result.className = "error";
    result.textContent = String(e.message || e);
  } finally {
    button.disabled = false;
  }
}

async function deadLetters() {
  const data = await api("dead-letters");
  if (!data.subject) {
    show(h("h2", {}, "Dead letters"), h("p", { class: "muted", id: "no-dlq" }, "No [relay] dead_letter_subject: a row that cannot be routed stops the relay instead."));
    return;
  }
  const action = (d) => data.write
    ? h("button", { class: "republish", "data-seq": d.message.seq, onclick: (e) => republish({ sequences: [d.message.seq] }, e.currentTarget) }, "Re-publish")
    : "";
  show(
    h("h2", {}, "Dead letters on " + data.subject),
    data.write
      ? h("div", { class: "toolbar" },
          h("button", { id: "republish-all", onclick: (e) => republish({ all: true }, e.currentTarget) }, "Re-publish all"),
          h("span", { class: "muted" }, "Fix the cause first (the row, or the mapping and a restart): each row is read again from its table and published as it is now."))
      : h("p", { class: "muted" }, "Read-only: [http] console_write = true (with a token) lets this page re-publish."),
    h("p", { id: "republish-result" }),
    h("table", { id: "dead-letters" },
      h("thead", {}, h("tr", {}, h("th", {}, "seq"), h("th", {}, "stored"), h("th", {}, "reason"), h("th", {}, "row"), h("th", {}, ""))),
      h("tbody", {}, data.messages.map((d) => h("tr", { "data-dead-letter": d.message.seq },
        h("td", { class: "num" }, h("a", { href: "#event/" + d.message.seq }, d.message.seq)),
        h("td", {}, d.message.stored_at),
        h("td", { class: "reason" }, d.reason || "–"),
        h("td", {}, h("code", {}, d.message.payload)),
        h("td", {}, action(d)))))),
    data.messages.length ? "" : h("p", { class: "muted" }, "None."),
  );
}

async function consumers() {
  const data = await api("consumers");
  const result = h("p", { id: "signal-result" });
  const replay = (c) => {
    if (!data.write) return "";
    const input = h("input", { class: "replay-from", "data-consumer": c.name, placeholder: "LSN 0/16B3748 or 15m ago" });
    // nats-server before 2.14 cannot move a consumer in place: it is deleted and re-created.
    const recreate = h("input", { type: "checkbox", class: "replay-recreate", "data-consumer": c.name });
    const go = h("button", { class: "replay", "data-consumer": c.name, onclick: (e) => {
      const v = input.value.trim();
      const args = /^[0-9A-Fa-f]+\/[0-9A-Fa-f]+$/.test(v) ? { consumer: c.name, from_lsn: v } : { consumer: c.name, since: v };
      if (recreate.checked) args.recreate = true;
      askSignal("replay", args, e.currentTarget, result);
    } }, "Replay");
    return h("span", {}, input, h("label", { title: "nats-server before 2.14: delete and re-create it (only while nothing reads it)" }, recreate, " re-create"), go);
  };
  show(
    h("h2", {}, "Consumers"),
    h("p", { class: "muted" }, "Durable consumers of the stream; last sequence " + data.stream_last_sequence +
      (data.ephemeral_readers ? " · " + data.ephemeral_readers + " readers without a durable name (tail, this console) not listed" : "")),
    h("table", { id: "consumers" },
      h("thead", {}, h("tr", {}, ["name", "filters", "pending", "ack pending", "redelivered", "ack floor", "delivered", "behind stream", data.write ? "replay from" : ""].map((t) => h("th", {}, t)))),
      h("tbody", {}, data.consumers.map((c) => h("tr", { "data-consumer": c.name },
        h("td", {}, c.name),
        h("td", {}, c.filters.join(", ") || "all"),
        h("td", { class: "num" }, c.pending),
        h("td", { class: "num" }, c.ack_pending),
        h("td", { class: "num" }, c.redelivered),
        h("td", { class: "num" }, c.ack_floor),
        h("td", { class: "num" }, c.delivered),
        h("td", { class: "num" }, c.behind_stream),
        h("td", {}, replay(c)))))),
    result,
  );
}

// A signal's progress in words: waiting, a backfill's rows, a replay's range, a restore's line.
function signalProgress(p) {
  if (!p) return "–";
  if (p.waiting_behind) return "waiting behind signal " + p.waiting_behind;
  if (p.rows_done !== undefined) {
    return p.rows_done + " rows" + (p.percent != null ? " · " + p.percent + " %" : "") +
      (p.eta_seconds != null ? " · ETA " + p.eta_seconds + " s" : "");
  }
  if (p.messages !== undefined) return p.messages + " messages from sequence " + p.from_sequence;
  if (p.line) return p.line;
  return JSON.stringify(p);
}

function backfillForm(data) {
  if (!data.write) return "";
  const table = h("select", { id: "backfill-table" }, data.tables.map((t) => h("option", { value: t }, t)));
  const filter = h("input", { id: "backfill-where", placeholder: "optional SQL condition, e.g. created_at > now() - interval '1 day'" });
  const restart = h("input", { id: "backfill-restart", type: "checkbox" });
  const result = h("span", { id: "signal-result" });
  const go = h("button", { id: "backfill-start", onclick: (e) => {
    const args = { table: table.value, restart: restart.checked };
    if (filter.value.trim()) args.where = filter.value.trim();
    askSignal("backfill", args, e.currentTarget, result);
  } }, "Start a backfill");
  return h("div", { class: "toolbar" }, table, filter, h("label", {}, restart, " start over"), go, result);
}

async function backfills() {
  const data = await api("backfills");
  const pct = (done, est) => est ? Math.min(100, done * 100 / est).toFixed(1) + " %" : "–";
  show(
    h("h2", {}, "Backfills"),
    backfillForm(data),
    h("table", { id: "cursors" },
      h("thead", {}, h("tr", {}, ["table", "filter", "rows done", "of about", "progress", "started", "finished"].map((t) => h("th", {}, t)))),
      h("tbody", {}, data.cursors.map((c) => h("tr", {},
        h("td", {}, c.table + (c.on_create ? " (at slot creation)" : "")),
        h("td", {}, h("code", {}, c.filter || "–")),
        h("td", { class: "num" }, c.rows_done),
        h("td", { class: "num" }, c.rows_estimate ?? "–"),
        h("td", { class: "num" }, pct(c.rows_done, c.rows_estimate)),
        h("td", {}, c.started_at),
        h("td", {}, c.finished_at || "running"))))),
    h("h2", {}, "Signals from SQL"),
    h("p", { class: "muted" }, "INSERT INTO outbox_relay.signal (kind, args) VALUES ('backfill', '{\"table\": \"public.outbox\"}');"),
    h("table", { id: "signals" },
      h("thead", {}, h("tr", {}, ["id", "kind", "args", "by", "state", "progress", "outcome or error"].map((t) => h("th", {}, t)))),
      h("tbody", {}, data.signals.map((s) => h("tr", { "data-signal": s.id },
        h("td", { class: "num" }, s.id),
        h("td", {}, s.kind),
        h("td", {}, h("code", {}, JSON.stringify(s.args))),
        h("td", {}, s.requested_by + " at " + s.requested_at),
        h("td", { class: "state" }, s.state),
        h("td", {}, signalProgress(s.progress)),
        h("td", { class: s.error ? "error" : "" }, s.error || s.outcome || "–"))))),
  );
}

async function config() {
  const data = await api("config");
  show(
    h("h2", {}, "Configuration"),
    h("p", { class: "muted" }, "As `outbox-relay config print` shows it; secrets redacted."),
    h("table", { id: "config" }, h("tbody", {}, data.lines.map(([k, v]) => h("tr", {}, h("th", {}, k), h("td", {}, h("code", {}, v)))))),
  );
}

// A step of a trace as a table of its fields: scalars as text, `columns` and `headers` one per
// line, anything else as compact JSON.
function fields(obj, id) {
  const show = (k, v) => {
    if (v === null || v === undefined) return "–";
    if (k === "columns" && Array.isArray(v)) return v.map((c) => c.name + " = " + (c.value === null ? "NULL" : c.value)).join("\n");
    if (k === "headers" && Array.isArray(v)) return v.map(([n, x]) => n + ": " + x).join("\n");
    return typeof v === "object" ? JSON.stringify(v) : String(v);
  };
  return h("table", { id }, h("tbody", {}, Object.entries(obj || {}).map(([k, v]) =>
    h("tr", {}, h("th", {}, k), h("td", {}, h("pre", { class: "plain" }, show(k, v)))))));
}

async function trace(id) {
  const t = await api("trace/" + encodeURIComponent(id));
  const step = (title, ...body) => h("div", { class: "step" }, h("h3", {}, title), ...body);
  const pub = t.publish || {};
  const ledger = t.ledger && t.ledger.Ok ? t.ledger.Ok : null;
  show(
    h("h2", {}, "Trace " + t.event_id),
    step("Row: " + (t.row.state || "?"), fields(t.row, "trace-row")),
    step("Published: " + (pub.state || "?"), fields(pub, "trace-publish")),
    step("Consumers (" + t.consumers.length + ")",
      h("table", { id: "trace-consumers" },
        h("thead", {}, h("tr", {}, ["consumer", "filters", "state", "details", "ack floor", "delivered"].map((x) => h("th", {}, x)))),
        h("tbody", {}, t.consumers.map((c) => {
          const { state, ...details } = c.delivery || {};
          return h("tr", {}, h("td", {}, c.name), h("td", {}, c.filters.join(", ") || "all"),
            h("td", { class: "state" }, state || "?"), h("td", {}, JSON.stringify(details)),
            h("td", { class: "num" }, c.ack_floor), h("td", { class: "num" }, c.delivered));
        })))),
    step("Ledger", ledger
      ? (ledger.length ? h("table", { id: "trace-ledger" }, h("tbody", {}, ledger.map((a) => h("tr", {},
          h("td", {}, a.consumer), h("td", {}, "applied " + a.applied_at), h("td", {}, "seq " + a.stream_seq), h("td", {}, a.subject)))))
        : h("p", { class: "muted", id: "trace-ledger" }, "No consumer recorded it in outbox_consumer_ledger."))
      : h("p", { class: "muted", id: "trace-ledger" }, "Not readable: " + (t.ledger && t.ledger.Err))),
  );
}

const views = { overview, events, event: oneEvent, "dead-letters": deadLetters, consumers, backfills, config, trace };

// The state badge, from the relay's readiness (cheap, on every view): `/readyz`, or a fleet
// pipeline's own.
async function badge() {
  const el = document.getElementById("relay-state");
  try {
    const r = await fetch(READY, { headers: tokenHeaders() });
    const body = await r.json();
    if (typeof body.ready !== "boolean") throw new Error(body.error || "HTTP " + r.status);
    el.textContent = body.ready ? "ready" : "not ready";
    el.className = "badge " + (body.ready ? "ok" : "bad");
    el.title = (body.reasons || []).join("; ");
  } catch (e) {
    el.textContent = "no answer";
    el.className = "badge bad";
    el.title = String(e.message || e);
  }
}

async function route() {
  clearTimeout(timer);
  document.body.dataset.loaded = "false";
  const badgeShown = badge();
  const [name, ...rest] = (location.hash.replace(/^#/, "") || "overview").split("/");
  const arg = rest.length ? decodeURIComponent(rest.join("/")) : undefined;
  for (const a of document.querySelectorAll("nav a")) {
    a.classList.toggle("active", a.getAttribute("href") === "#" + name);
  }
  const view = views[name] || overview;
  try {
    await view(arg);
    await badgeShown;
    document.body.dataset.view = name;
    document.body.dataset.loaded = "true";
  } catch (e) {
    fail(e);
    document.body.dataset.loaded = "error";
  }
  // The overview refreshes itself; the lists refresh when asked (their address again).
  if (view === overview) timer = setTimeout(route, REFRESH_MS);
}

document.getElementById("trace-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const id = document.getElementById("trace-id").value.trim();
  if (id) location.hash = "trace/" + encodeURIComponent(id);
});
window.addEventListener("hashchange", route);
// A click on the view already shown shows it again, fresh.
for (const a of document.querySelectorAll("nav a")) {
  a.addEventListener("click", () => { if (a.getAttribute("href") === location.hash) route(); });
}
route();
