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
