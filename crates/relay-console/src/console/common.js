// What the console's pages share (one relay's and the fleet's): the token, requests, and
// elements built with their values as text (never as HTML), so nothing in an event can run.
"use strict";

const TOKEN_KEY = "outbox-relay-console-token";
const REFRESH_MS = 5000;

// A token in the address (#token=…) is kept for this tab (every page of the console reads it)
// and taken out of the address, which shows `fragment` instead.
function takeToken(fragment) {
  const m = location.hash.match(/^#token=([^&]+)/);
  if (m) {
    sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(m[1]));
    history.replaceState(null, "", location.pathname + fragment);
  }
}

// The tab's token as request headers (none without one).
function tokenHeaders() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return token ? { Authorization: "Bearer " + token } : {};
}

// The body of `url` as JSON (POST `payload` when given), with the tab's token; throws with
// the server's `error` when it refused.
async function request(url, payload) {
  const headers = tokenHeaders();
  const init = { headers };
  if (payload !== undefined) {
    init.method = "POST";
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(payload);
  }
  const response = await fetch(url, init);
  const body = await response.json().catch(() => ({ error: "not JSON: HTTP " + response.status }));
  if (!response.ok) throw new Error(body.error || "HTTP " + response.status);
  return body;
}

// h("td", {class: "num"}, "text", child…): an element with text children.
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function show(...nodes) {
  const view = document.getElementById("view");
  view.replaceChildren(...nodes);
  document.getElementById("updated").textContent = "Updated " + new Date().toLocaleTimeString();
}

function fail(error) {
  show(h("p", { class: "error", id: "error" }, String(error.message || error)));
}

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let v = Number(n);
  while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return (i === 0 ? v : v.toFixed(1)) + " " + units[i];
}

function ago(iso) {
  if (!iso) return "–";
  const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  return iso + " (" + (s < 90 ? s.toFixed(0) + " s" : (s / 60).toFixed(0) + " min") + " ago)";
}
