/* fleetd admin UI: local times, copy buttons, log boxes that follow their newest line. No inline script: the pages' CSP forbids it. */
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

  // "Add a variable": one more name/value row, numbered after the last, its labels tied to its inputs.
  function addRow(button) {
    var box = document.getElementById(button.getAttribute("data-add-row"));
    var rows = box ? box.querySelectorAll(".env-row") : [];
    if (!rows.length) return;
    var row = rows[rows.length - 1].cloneNode(true);
    var n = rows.length + 1;
    var labels = row.querySelectorAll("label"), inputs = row.querySelectorAll("input");
    for (var i = 0; i < inputs.length; i++) {
      var id = inputs[i].id.replace(/-\d+$/, "-" + n);
      inputs[i].id = id;
      inputs[i].value = "";
      labels[i].setAttribute("for", id);
      labels[i].textContent = labels[i].textContent.replace(/\d+/, String(n));
    }
    rows[rows.length - 1].after(row);
    row.querySelector("input").focus();
  }

  document.addEventListener("click", function (event) {
    var button = event.target.closest && event.target.closest("button[data-copy]");
    if (button) copyFrom(button);
    var add = event.target.closest && event.target.closest("button[data-add-row]");
    if (add) addRow(add);
  });
  // Log boxes open at their newest line and stay there while new lines come, unless the reader scrolled
  // up; lines loaded at the top ("Load earlier lines") leave the reader where they were.
  function nearBottom(box) { return box.scrollHeight - box.scrollTop - box.clientHeight < 24; }
  function logsToBottom() {
    var boxes = document.querySelectorAll("pre.log");
    for (var i = 0; i < boxes.length; i++) boxes[i].scrollTop = boxes[i].scrollHeight;
  }
  var logState = null;
  document.addEventListener("htmx:oobBeforeSwap", function (event) {
    var box = document.getElementById("log-lines");
    if (box && event.detail.target === box) {
      logState = {follow: nearBottom(box), height: box.scrollHeight, top: box.scrollTop};
    }
  });
  document.addEventListener("htmx:oobAfterSwap", function (event) {
    var box = document.getElementById("log-lines");
    if (!box || event.detail.target !== box || !logState) return;
    var added = box.scrollHeight - logState.height;
    if (event.detail.elt && /afterbegin/.test(event.detail.elt.getAttribute("hx-swap-oob") || "")) {
      box.scrollTop = logState.top + added;
    } else if (logState.follow) {
      box.scrollTop = box.scrollHeight;
    }
    logState = null;
  });
  // The header's project switcher: choosing a project switches at once (its button stays for pages
  // read without scripts).
  document.addEventListener("change", function (event) {
    var select = event.target.closest && event.target.closest("select[data-autosubmit]");
    if (select && select.form) select.form.requestSubmit();
  });
  document.addEventListener("DOMContentLoaded", function () { localTimes(document); logsToBottom(); });
  document.addEventListener("htmx:afterSettle", function (event) { localTimes(event.target); });
  document.addEventListener("htmx:oobAfterSwap", function (event) { localTimes(event.target); });
})();
