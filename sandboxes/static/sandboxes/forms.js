// Checks a form can make before it is sent: a prompt's length (with a counter) and the
// files chosen for upload (count and sizes), against the server's limits given as data
// attributes. A field over a limit gets a custom validity message, so the browser does
// not send the form; the server checks everything again.
// Also: confirmation of forms with data-confirm, and copy buttons (data-copy).
(function () {
  "use strict";
  const humanSize = window.Quor.humanSize;
  const number = new Intl.NumberFormat("en");
  const FORM_OVERHEAD_BYTES = 1024 * 1024;

  // What the server counts: characters (not UTF-16 units), and each line break as a
  // form sends it, CR LF, unless the field says otherwise (the composer sends JSON).
  function submittedLength(text, lineBreakChars) {
    let length = 0;
    for (const character of text) {
      length += character === "\n" ? lineBreakChars : 1;
    }
    return length;
  }

  // Marks a field invalid while a check here fails, leaving alone a mark the server set
  // until the field changes.
  function markInvalid(field, invalid) {
    if (invalid) field.setAttribute("aria-invalid", "true");
    else field.removeAttribute("aria-invalid");
  }

  function watchLength(field) {
    const limit = Number(field.dataset.maxChars);
    const counter = document.getElementById(field.id + "-count");
    function update() {
      const length = submittedLength(field.value, Number(field.dataset.lineBreakChars || 2));
      const over = length > limit;
      const excess = length - limit;
      const problem = over
        ? "This is " + number.format(excess) + (excess === 1 ? " character" : " characters") +
          " too long: at most " + number.format(limit) + "."
        : "";
      field.setCustomValidity(problem);
      if (counter) {
        counter.textContent = over
          ? problem
          : number.format(length) + " / " + number.format(limit) + " characters";
        counter.classList.toggle("over", over);
      }
    }
    field.addEventListener("input", function () {
      update();
      markInvalid(field, !field.validity.valid);
    });
    update();
  }

  function filesProblem(input) {
    const files = Array.from(input.files);
    const maxFiles = Number(input.dataset.maxFiles);
    const maxFileBytes = Number(input.dataset.maxFileBytes);
    // The request also carries the form's other fields and multipart's framing: room
    // for them, so a choice this check allows is never refused by the server's limit.
    const maxTotalBytes = Number(input.dataset.maxTotalBytes) - FORM_OVERHEAD_BYTES;
    if (files.length > maxFiles) {
      return "You chose " + files.length + " files; at most " + maxFiles + " can be attached.";
    }
    const large = files.filter((file) => file.size > maxFileBytes);
    if (large.length) {
      return large.map((file) => file.name).join(", ") + (large.length === 1 ? " is" : " are") +
        " larger than " + humanSize(maxFileBytes) + ", the most one file can be.";
    }
    const total = files.reduce((sum, file) => sum + file.size, 0);
    if (total > maxTotalBytes) {
      return "These files are " + humanSize(total) + " together; at most " +
        humanSize(maxTotalBytes) + " can be sent at once.";
    }
    return "";
  }

  function watchFiles(input) {
    const message = document.createElement("p");
    message.className = "errors";
    message.id = input.id + "-check";
    message.setAttribute("role", "alert");
    message.hidden = true;
    const help = document.getElementById(input.id + "-help") || input;
    help.after(message);
    input.setAttribute(
      "aria-describedby",
      ((input.getAttribute("aria-describedby") || "") + " " + message.id).trim()
    );
    input.addEventListener("change", function () {
      const problem = filesProblem(input);
      input.setCustomValidity(problem);
      markInvalid(input, Boolean(problem));
      message.textContent = problem;
      message.hidden = !problem;
      // The server's message was about the files of the last attempt.
      const earlier = document.getElementById(input.id + "-error");
      if (earlier) earlier.hidden = true;
    });
  }

  function copyButton(button) {
    const source = document.getElementById(button.dataset.copy);
    const status = document.getElementById(button.dataset.copy + "-copied");
    function say(text) {
      if (status) status.textContent = text;
    }
    button.hidden = false;
    button.addEventListener("click", function () {
      source.select();
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(source.value).then(
          () => say("Copied."),
          () => say("Could not copy: press Ctrl+C (⌘C) to copy the selected token.")
        );
      } else {
        say(document.execCommand("copy")
          ? "Copied."
          : "Could not copy: press Ctrl+C (⌘C) to copy the selected token.");
      }
    });
  }

  document.querySelectorAll("textarea[data-max-chars]").forEach(watchLength);
  document.querySelectorAll("input[type=file][data-max-files]").forEach(watchFiles);
  document.querySelectorAll("button[data-copy]").forEach(copyButton);
  document.querySelectorAll("form[data-confirm]").forEach(function (form) {
    form.addEventListener("submit", function (event) {
      if (!window.confirm(form.dataset.confirm)) event.preventDefault();
    });
  });
  // A form that starts something slow says so the moment it is sent, before the next
  // page arrives; coming back to the page (the browser's back button) undoes it.
  document.querySelectorAll("form[data-busy-label]").forEach(function (form) {
    const button = form.querySelector("button[type=submit]");
    const label = button.textContent;
    form.addEventListener("submit", function (event) {
      if (event.defaultPrevented) return;
      if (form.getAttribute("aria-busy") === "true") {
        event.preventDefault(); // sent already: a second click would start it twice
        return;
      }
      button.textContent = form.dataset.busyLabel;
      button.setAttribute("aria-disabled", "true");
      form.setAttribute("aria-busy", "true");
    });
    window.addEventListener("pageshow", function () {
      button.textContent = label;
      button.removeAttribute("aria-disabled");
      form.removeAttribute("aria-busy");
    });
  });
})();
