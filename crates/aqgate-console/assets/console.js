// The aqgate console's one script: asks before a form marked data-confirm is sent, and
// copies a button's data-copy text (an `aqgate admin` command line) to the clipboard.
"use strict";
document.addEventListener("submit", function (e) {
  var f = e.target;
  var question = f && f.getAttribute && f.getAttribute("data-confirm");
  if (question && !window.confirm(question)) {
    e.preventDefault();
  }
});
document.addEventListener("click", function (e) {
  var b = e.target && e.target.closest && e.target.closest("button[data-copy]");
  if (!b) {
    return;
  }
  var text = b.getAttribute("data-copy");
  var said = function (what) {
    b.textContent = what;
  };
  if (navigator.clipboard && navigator.clipboard.writeText) {
    navigator.clipboard.writeText(text).then(function () {
      said("Copied");
    }, function () {
      said("Select and copy");
    });
  } else {
    said("Select and copy");
  }
});

// The live overview: on a page with data-live-events, one EventSource for the tab. An
// "overview" event names a fragment (data-fragment); it is fetched again and replaces the
// element's content (server-rendered, escaped HTML). Every (re)open fetches them all, for
// what changed while the stream was closed. Closed while the tab is hidden.
(function () {
  var root = document.querySelector("[data-live-events]");
  if (!root || typeof EventSource === "undefined") {
    return;
  }
  var url = root.getAttribute("data-live-events");
  var source = null;
  var loading = {};

  function refresh(name) {
    var el = root.querySelector('[data-fragment="' + name + '"]');
    if (!el || loading[name]) {
      return;
    }
    loading[name] = true;
    fetch(el.getAttribute("data-fragment-url"), { credentials: "same-origin", redirect: "error" })
      .then(function (r) {
        if (!r.ok) {
          throw new Error("HTTP " + r.status);
        }
        return r.text();
      })
      .then(function (text) {
        el.innerHTML = text;
      })
      .catch(function () {
        root.setAttribute("data-live-state", "stale");
      })
      .then(function () {
        loading[name] = false;
      });
  }

  function refreshAll() {
    var all = root.querySelectorAll("[data-fragment]");
    for (var i = 0; i < all.length; i++) {
      refresh(all[i].getAttribute("data-fragment"));
    }
  }

  function open() {
    if (source) {
      return;
    }
    source = new EventSource(url);
    source.addEventListener("open", function () {
      root.setAttribute("data-live-state", "open");
      refreshAll();
    });
    source.addEventListener("overview", function (e) {
      refresh(String(e.data));
    });
    source.addEventListener("error", function () {
      root.setAttribute("data-live-state", "reconnecting");
    });
  }

  function close() {
    if (source) {
      source.close();
      source = null;
      root.setAttribute("data-live-state", "closed");
    }
  }

  document.addEventListener("visibilitychange", function () {
    if (document.hidden) {
      close();
    } else {
      open();
    }
  });
  if (!document.hidden) {
    open();
  }
})();
