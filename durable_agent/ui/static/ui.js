// The run page's live updates: one EventSource on /api/runs/<id>/events. Each "update"
// brings server-rendered HTML (changed step rows, the chart, the header, the actions);
// nothing else is built here, so the page without this script shows the same things.
(function () {
  "use strict";
  var body = document.body;
  var runId = body.getAttribute("data-run");
  if (!runId || !window.EventSource) { return; }

  function firstOpen() {
    // The stream sends the steps from here on: the oldest step still open, else the next one.
    var rows = document.querySelectorAll("#steps > details.step");
    for (var i = 0; i < rows.length; i++) {
      if (rows[i].getAttribute("data-state") === "started") { return rows[i].getAttribute("data-seq"); }
    }
    return String(rows.length);
  }

  function replace(id, html) {
    var el = document.getElementById(id);
    if (el && typeof html === "string" && el.innerHTML !== html) { el.innerHTML = html; }
  }

  function putStep(step) {
    var holder = document.createElement("div");
    holder.innerHTML = step.html;
    var fresh = holder.firstElementChild;
    if (!fresh) { return; }
    var old = document.getElementById("step-" + step.seq);
    if (old) {
      fresh.open = old.open;  // keep what the reader expanded
      old.replaceWith(fresh);
      opened(fresh);
    } else {
      document.getElementById("steps").appendChild(fresh);
    }
  }

  function fetched(url) {
    return fetch(url, { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); });
  }

  // The files an opened step changed, as the unified diff the server makes (as text:
  // each line an element of its own, coloured by its first character).
  function loadDiff(row) {
    var pre = row.querySelector("pre.diff[data-diff]");
    if (!pre) { return; }
    var url = pre.getAttribute("data-diff");
    pre.removeAttribute("data-diff");
    fetched(url).then(function (text) {
      pre.textContent = "";
      text.split("\n").forEach(function (line) {
        var span = document.createElement("span");
        var head = line.slice(0, 3);
        span.className = head === "+++" || head === "---" ? "d-file" : line[0] === "+" ? "d-add"
          : line[0] === "-" ? "d-del" : line.slice(0, 2) === "@@" ? "d-hunk" : "";
        span.textContent = line + "\n";
        pre.appendChild(span);
      });
      if (!text) { pre.textContent = "(no textual change)"; }
    }).catch(function () { pre.setAttribute("data-diff", url); });
  }

  // Long pages leave step bodies out; fetch one when its row is opened.
  function opened(row) {
    if (!row.open) { return; }
    if (!row.hasAttribute("data-lazy")) { loadDiff(row); return; }
    row.removeAttribute("data-lazy");
    fetched("/runs/" + encodeURIComponent(runId) + "/steps/" + row.getAttribute("data-seq"))
      .then(function (html) { row.querySelector(".body").innerHTML = html; loadDiff(row); })
      .catch(function () { row.setAttribute("data-lazy", ""); });
  }
  var steps = document.getElementById("steps");
  if (steps) {
    steps.addEventListener("toggle", function (ev) {
      if (ev.target.matches && ev.target.matches("details.step")) { opened(ev.target); }
    }, true);
  }

  var source = new EventSource("/api/runs/" + encodeURIComponent(runId) + "/events?from=" + firstOpen());
  source.addEventListener("update", function (ev) {
    var doc = JSON.parse(ev.data);
    doc.steps.forEach(putStep);
    replace("chart", doc.chart);
    replace("header", doc.header);
    replace("actions", doc.actions);
    replace("conversation", doc.conversation);
    var count = document.getElementById("step-count");
    if (count) { count.textContent = String(doc.count); }
    body.setAttribute("data-status", doc.status);
    body.setAttribute("data-live", doc.live ? "yes" : "no");
  });
  // A streaming model call: its text, thinking and tool names so far (textContent only:
  // the model's words are never HTML here). An event without a seq: no call streams now.
  source.addEventListener("tokens", function (ev) {
    var doc = JSON.parse(ev.data);
    var box = document.getElementById("live");
    if (!box) { return; }
    if (doc.seq === null || doc.seq === undefined) { box.hidden = true; return; }
    box.querySelector(".live-thinking").textContent = doc.reasoning || "";
    box.querySelector(".live-tools").textContent = (doc.tools || []).length ? "→ " + doc.tools.join(", ") : "";
    box.querySelector(".live-text").textContent = doc.text || "";
    box.setAttribute("data-seq", String(doc.seq));
    box.hidden = false;
  });
  source.addEventListener("end", function () {
    body.setAttribute("data-live", "no");
    source.close();  // the run stopped: no reconnect loop
  });
})();
