// The aqgate console's one script: asks before a form marked data-confirm is sent.
"use strict";
document.addEventListener("submit", function (e) {
  var f = e.target;
  var question = f && f.getAttribute && f.getAttribute("data-confirm");
  if (question && !window.confirm(question)) {
    e.preventDefault();
  }
});
