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
    } else {
      document.getElementById("steps").appendChild(fresh);
    }
  }

  // Long pages leave step bodies out; fetch one when its row is opened.
  var steps = document.getElementById("steps");
  if (steps) {
    steps.addEventListener("toggle", function (ev) {
      var row = ev.target;
      if (!row.open || !row.hasAttribute("data-lazy")) { return; }
      row.removeAttribute("data-lazy");
      fetch("/runs/" + encodeURIComponent(runId) + "/steps/" + row.getAttribute("data-seq"),
            { credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
        .then(function (html) { row.querySelector(".body").innerHTML = html; })
        .catch(function () { row.setAttribute("data-lazy", ""); });
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
  source.addEventListener("end", function () {
    body.setAttribute("data-live", "no");
    source.close();  // the run stopped: no reconnect loop
  });
})();
