/* fleetd admin UI: local times, copy buttons. No inline script: the pages' CSP forbids it. */
(function () {
  "use strict";

  function localTimes(root) {
    var nodes = (root || document).querySelectorAll("time[datetime][data-local]");
    for (var i = 0; i < nodes.length; i++) {
      var el = nodes[i];
      var when = new Date(el.getAttribute("datetime"));
      if (isNaN(when.getTime())) continue;
      el.textContent = when.toLocaleString(undefined, {
        year: "numeric", month: "short", day: "numeric",
        hour: "2-digit", minute: "2-digit", second: "2-digit", timeZoneName: "short"
      });
      el.title = el.getAttribute("datetime") + " (UTC)";
      el.removeAttribute("data-local");
    }
  }

  function copyFrom(button) {
    var input = document.getElementById(button.getAttribute("data-copy"));
    if (!input) return;
    var status = button.closest("section") && button.closest("section").querySelector(".copy-status");
    function done(ok) {
      if (status) status.textContent = ok ? "Copied to the clipboard." : "Select the text and copy it with Ctrl+C.";
    }
    input.focus();
    input.select();
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(input.value).then(function () { done(true); }, function () { done(false); });
    } else {
      var ok = false;
      try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
      done(ok);
    }
  }

  document.addEventListener("click", function (event) {
    var button = event.target.closest && event.target.closest("button[data-copy]");
    if (button) copyFrom(button);
  });
  document.addEventListener("DOMContentLoaded", function () { localTimes(document); });
  document.addEventListener("htmx:afterSettle", function (event) { localTimes(event.target); });
  document.addEventListener("htmx:oobAfterSwap", function (event) { localTimes(event.target); });
})();
