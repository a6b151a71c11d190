// durapay console: live updates by polling one small JSON endpoint per page (no other script).
// A flow page reloads itself when the flow's version moves; the home page updates its counts in place.
(function () {
  "use strict";
  var box = document.querySelector("[data-live]");
  if (!box || !window.fetch) { return; }
  var url = box.getAttribute("data-live");
  var stopped = { succeeded: 1, failed: 1, cancelled: 1, needs_attention: 1 };

  function every() {
    if (!box.hasAttribute("data-version")) { return 5000; }  // the home page: counters
    var state = box.getAttribute("data-state");
    return state && stopped[state] ? 10000 : 2000;
  }

  function apply(data) {
    if (box.hasAttribute("data-version")) {
      if (data.version !== null && String(data.version) !== box.getAttribute("data-version")) {
        window.location.reload();
        return false;
      }
      return true;
    }
    var name;
    for (name in data.states || {}) {
      var n = document.querySelector('[data-count="' + name + '"]');
      if (n) { n.textContent = data.states[name]; }
    }
    for (name in data.ended_last_minute || {}) {
      var e = document.querySelector('[data-ended="' + name + '"]');
      if (e) { e.textContent = data.ended_last_minute[name]; }
    }
    for (name in data.health || {}) {
      var h = document.querySelector('[data-health="' + name + '"]');
      if (h) {
        h.className = data.health[name] ? "ok" : "bad";
        h.querySelector("span").textContent = data.health[name] ? "up" : "DOWN";
      }
    }
    return true;
  }

  function poll() {
    if (document.hidden) { window.setTimeout(poll, every()); return; }
    fetch(url, { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (data) { if (!data || apply(data)) { window.setTimeout(poll, every()); } })
      .catch(function () { window.setTimeout(poll, 10000); });
  }
  window.setTimeout(poll, every());
})();
