// The console's only script: times in the browser's zone, the zone of the date-time
// pickers, a confirmation before each write, and the live tail (server-sent events).
"use strict";

function localTime(us) {
  const d = new Date(Math.floor(Number(us) / 1000));
  const pad = (n, w = 2) => String(n).padStart(w, "0");
  const micros = pad(Number(BigInt(us) % 1000000n), 6);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${micros} local`;
}

function showTimes(root) {
  for (const el of root.querySelectorAll("time[data-us]")) {
    if (el.dataset.us && el.dataset.us !== "None" && !el.dataset.shown) {
      el.textContent = localTime(el.dataset.us);
      el.dataset.shown = "1";
    }
  }
}

// A picker's value has no zone: the browser's offset on the date picked (summer time
// or not), not today's, says what UTC time it is.
function zoneOf(form) {
  const picker = form.querySelector('input[type="datetime-local"]');
  const when = picker && picker.value ? new Date(picker.value) : new Date();
  return String(isNaN(when) ? new Date().getTimezoneOffset() : when.getTimezoneOffset());
}

function fillZones() {
  for (const el of document.querySelectorAll('input[name="tz"]')) {
    const form = el.form;
    el.value = zoneOf(form);
    form.addEventListener("submit", () => { el.value = zoneOf(form); });
  }
}

function confirmWrites() {
  for (const form of document.querySelectorAll("form.write")) {
    form.addEventListener("submit", (event) => {
      if (!window.confirm(form.dataset.confirm || "Write to the log?")) {
        event.preventDefault();
        return;
      }
      form.querySelector('input[name="confirm"]').value = "yes";
    });
  }
}

function cell(row, text, cls) {
  const td = row.insertCell();
  if (cls) td.className = cls;
  td.textContent = text;
  return td;
}

function addRow(body, r) {
  const row = body.insertRow();
  row.dataset.partition = r.partition;
  row.dataset.offset = r.offset;
  row.className = "fresh";
  cell(row, r.partition, "n");
  cell(row, r.offset, "n");
  const when = cell(row, "");
  const t = document.createElement("time");
  t.dataset.us = r.timestamp_us;
  when.appendChild(t);
  when.appendChild(document.createElement("br"));
  const utc = document.createElement("span");
  utc.className = "muted";
  utc.textContent = r.utc;
  when.appendChild(utc);
  cell(row, r.key_null ? "(none)" : r.key, "key");
  const value = cell(row, "", "value " + r.value_form);
  const pre = document.createElement("pre");
  pre.textContent = r.value + (r.value_cut ? "…" : "");
  value.appendChild(pre);
  cell(row, r.headers.map(([n, v]) => `${n}: ${v}`).join("\n"));
  cell(row, r.txn, r.txn ? "txn " + r.txn : "");
  showTimes(row);
}

function liveTail() {
  const button = document.getElementById("tail-toggle");
  const body = document.querySelector("#records tbody");
  const status = document.getElementById("tail-status");
  if (!button || !body) return;
  let source = null;
  let cursor = button.dataset.cursor;
  const stop = (why) => {
    if (source) source.close();
    source = null;
    button.textContent = "Live tail";
    status.textContent = why;
  };
  button.addEventListener("click", () => {
    if (source) { stop("paused"); return; }
    const params = new URLSearchParams({stream: button.dataset.stream, cursor,
      partition: button.dataset.partition, key: button.dataset.key,
      key_match: button.dataset.keyMatch, value: button.dataset.value});
    source = new EventSource("/api/tail?" + params.toString());
    button.textContent = "Pause";
    status.textContent = "following";
    source.onmessage = (event) => {
      const update = JSON.parse(event.data);
      cursor = update.cursor;
      for (const r of update.rows) addRow(body, r);
      status.textContent = `following · ${body.rows.length} rows`;
    };
    source.onerror = () => { if (source && source.readyState === EventSource.CLOSED) stop("ended"); };
  });
}

function startFields() {
  const start = document.getElementById("start");
  if (!start) return;
  const show = () => {
    for (const el of document.querySelectorAll(".when-offset")) el.hidden = start.value !== "offset";
    for (const el of document.querySelectorAll(".when-time")) el.hidden = start.value !== "time";
  };
  start.addEventListener("change", show);
  show();
}

document.addEventListener("DOMContentLoaded", () => {
  showTimes(document);
  fillZones();
  confirmWrites();
  liveTail();
  startFields();
});
