// Every page: small helpers the page scripts share (`Quor.el`, `Quor.humanSize`), the
// navigation behind a Menu button on narrow screens, and times written by the server in
// UTC shown in the reader's own time zone. Loaded in <head>, before the page scripts.
window.Quor = (function () {
  "use strict";

  // An element with a class and text; text is always set as text, never as HTML.
  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = text;
    return node;
  }

  // Sizes as people read them, the way Django's filesizeformat writes them (1 KB = 1024 B).
  function humanSize(bytes) {
    if (typeof bytes !== "number" || !Number.isFinite(bytes) || bytes < 0) return "";
    if (bytes < 1024) return bytes + " B";
    const units = ["KB", "MB", "GB", "TB"];
    let value = bytes;
    let unit = -1;
    do { value /= 1024; unit += 1; } while (value >= 1024 && unit < units.length - 1);
    return (value < 10 ? value.toFixed(1).replace(/\.0$/, "") : Math.round(value)) + " " + units[unit];
  }

  function setUpMenu() {
    const toggle = document.getElementById("menu-toggle");
    const nav = document.getElementById("site-nav");
    if (!toggle || !nav) return;
    document.documentElement.classList.add("has-menu");
    toggle.hidden = false;
    toggle.addEventListener("click", () => {
      const open = toggle.getAttribute("aria-expanded") !== "true";
      toggle.setAttribute("aria-expanded", String(open));
      nav.classList.toggle("open", open);
    });
  }

  function showLocalTimes() {
    const pad = (n) => String(n).padStart(2, "0");
    const zone = Intl.DateTimeFormat().resolvedOptions().timeZone || "local time";
    document.querySelectorAll("time[data-local]").forEach((node) => {
      const when = new Date(node.dateTime);
      if (Number.isNaN(when.getTime())) return;
      node.textContent = when.getFullYear() + "-" + pad(when.getMonth() + 1) + "-" + pad(when.getDate()) + " " + pad(when.getHours()) + ":" + pad(when.getMinutes());
      node.title = "Your time (" + zone + ")";
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    setUpMenu();
    showLocalTimes();
  });

  return { el, humanSize };
})();
