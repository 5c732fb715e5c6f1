// Legend entries hide and show their curve: click one to toggle it, double-click one to show it
// alone (double-click it again to show every curve). Works per chart; nothing is fetched.
document.addEventListener("click", function (e) {
  var button = e.target.closest ? e.target.closest("button.legend-item[data-k]") : null;
  var figure = button && button.closest("figure");
  if (!figure) return;
  var buttons = Array.prototype.slice.call(figure.querySelectorAll("button.legend-item[data-k]"));
  function set(b, on) {
    b.setAttribute("aria-pressed", on ? "true" : "false");
    figure.querySelectorAll('svg [data-k="' + b.getAttribute("data-k") + '"]').forEach(function (g) {
      g.classList.toggle("off", !on);
    });
  }
  if (e.detail === 2) {
    var alone = buttons.every(function (b) { return b === button || b.getAttribute("aria-pressed") === "false"; });
    buttons.forEach(function (b) { set(b, alone || b === button); });
  } else {
    set(button, button.getAttribute("aria-pressed") === "false");
  }
});
