// ferry console: refreshes the overview's figures every 5 seconds from
// api/overview. The page works without it; it only writes text (no HTML).
(function () {
  "use strict";
  var base = document.body.getAttribute("data-base") || "";
  if (!document.querySelector("[data-live]")) return;
  function tick() {
    fetch(base + "/api/overview", { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (d) {
        if (!d) return;
        document.querySelectorAll("[data-live]").forEach(function (el) {
          var k = el.getAttribute("data-live");
          if (!(k in d)) return;
          var target = el.querySelector("a") || el;
          target.textContent = String(d[k]);
        });
        document.querySelectorAll("[data-live-dlq]").forEach(function (el) {
          var q = el.getAttribute("data-live-dlq");
          if (d.dlq && q in d.dlq) el.textContent = String(d.dlq[q]);
        });
      })
      .catch(function () {});
  }
  setInterval(tick, 5000);
})();
