// The console's only script: progressive enhancement, every page works without it.
// - The runs list (an element with data-refresh="SECONDS") re-reads its live part from the
//   server while the tab is visible; a failed read leaves the last good one in place.
// - Timeline bars get a width proportional to each phase's duration.
(function () {
  "use strict";

  function refresh(box) {
    var seconds = Math.max(2, parseInt(box.getAttribute("data-refresh"), 10) || 5);
    var url = new URL(window.location.href);
    url.searchParams.set("fragment", "live");
    function tick() {
      if (document.visibilityState !== "visible") { return; }
      fetch(url.toString(), { credentials: "same-origin", headers: { "Accept": "text/html" } })
        .then(function (r) {
          if (r.redirected || !r.ok) { throw new Error("status " + r.status); }
          return r.text();
        })
        .then(function (html) { box.innerHTML = html; box.setAttribute("data-refreshed", Date.now()); })
        .catch(function () { box.setAttribute("data-refresh-failed", Date.now()); });
    }
    window.setInterval(tick, seconds * 1000);
    document.addEventListener("visibilitychange", tick);
  }

  function bars() {
    var spans = document.querySelectorAll(".bar[data-seconds]");
    var max = 0;
    spans.forEach(function (s) { max = Math.max(max, parseFloat(s.getAttribute("data-seconds")) || 0); });
    spans.forEach(function (s) {
      var v = parseFloat(s.getAttribute("data-seconds")) || 0;
      s.style.width = (max > 0 ? Math.max(2, Math.round(120 * v / max)) : 2) + "px";
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-refresh]").forEach(refresh);
    bars();
  });
})();
