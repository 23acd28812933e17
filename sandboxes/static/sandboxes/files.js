// The session page's Files panel: the sandbox's state while it is not running (asleep,
// waking, failed to wake), and the session's folder through the authenticated files API,
// reloaded when the event stream (session.js) reports a changed file.
//
// The sandbox's state comes from GET /api/v1/sandbox/, a read that never counts as use
// (it never keeps the sandbox awake): every second while it changes (waking, starting,
// going to sleep), every 15 s while it rests (asleep, stopped), so that a wake started
// elsewhere (a follow-up, a web app) shows here too, and every minute while it runs, so
// that it falling asleep shows too; never while the tab is hidden (asked again as soon
// as it is shown). Listing the folder is use: it wakes a sleeping sandbox, which is what
// the "Wake up" button does.
//
// Answers can arrive out of order (clicks, reloads for changed files, files opened from
// the conversation): only the latest listing and the latest preview asked for are shown.
(function () {
  "use strict";
  const { el, humanSize } = window.Quor;
  const root = document.getElementById("session");
  const panel = document.getElementById("files-panel");
  const sessionId = root.dataset.sessionId;
  const api = "/api/v1/sessions/" + encodeURIComponent(sessionId) + "/files/";

  const CHANGING = ["provisioning", "restoring", "snapshotting", "stopping"];
  const POLL_CHANGING_MS = 1000;
  const POLL_RESTING_MS = 15000;
  const POLL_RUNNING_MS = 60000;
  // A listing slower than this is probably a wake: the state is then asked for too.
  const SLOW_LISTING_MS = 800;
  // Files changed this long ago or less are marked, as are those the stream reported.
  const RECENT_S = 10 * 60;

  const STATE_LABELS = {
    absent: "not started", provisioning: "starting", running: "running",
    snapshotting: "going to sleep", sleeping: "asleep", restoring: "waking up",
    stopping: "stopping", stopped: "stopped", failed: "failed",
    unrestorable: "workspace lost",
  };
  const STATUS_CLASSES = { sleeping: "sleeping", restoring: "waking", provisioning: "provisioning", failed: "failed", unrestorable: "failed", running: "done" };

  // Sentences for the error codes the files API and the sandbox can answer with.
  const SENTENCES = {
    "files.not_found": "This file or folder is no longer there: the agent may have moved or deleted it.",
    "files.symlink_refused": "This is a link. The file browser does not follow links: open the folder it points to instead.",
    "files.not_a_file": "This is not a regular file, so it cannot be downloaded.",
    "files.not_a_directory": "This is not a folder.",
    "files.permission_denied": "The sandbox does not allow reading this.",
    "files.invalid_path": "This path cannot be opened.",
    "files.archive_too_large": "This folder is too large to download as one archive. Open it and download the folders inside it instead.",
    "sandboxes.unavailable": "Your sandbox could not be reached. Try again in a moment.",
    "sandboxes.workspace_unrestorable": "Your workspace could not be restored: see the notice at the top of the page.",
  };
  const MANAGED_LABELS = {
    library: "Your Library · read-only",
    skills: "Skills · read-only",
    instructions: "The agent's instructions · written by Quor",
  };

  function show(node, visible) {
    node.hidden = !visible;
  }

  // A refusal of the API as a sentence, with its code and text behind "Details".
  function problem(box, error) {
    const code = (error && error.code) || "";
    box.replaceChildren(el("span", null, SENTENCES[code] || "Something went wrong. Try again in a moment."));
    if (code) {
      const details = el("details", "problem-details");
      details.appendChild(el("summary", null, "Details"));
      details.appendChild(el("code", null, code));
      if (error.message) details.appendChild(el("span", null, " " + error.message));
      box.appendChild(details);
    }
    show(box, true);
  }

  function errorOf(response) {
    return response.json().then((body) => body.error || {}, () => ({ code: "", message: "HTTP " + response.status }));
  }

  // --- the sandbox's state ---------------------------------------------------------

  const stateLabel = document.getElementById("sandbox-state-label");
  const stateBox = document.getElementById("sandbox-state");
  const stateTitle = document.getElementById("sandbox-state-title");
  const stateText = document.getElementById("sandbox-state-text");
  const progress = document.getElementById("sandbox-progress");
  const elapsed = document.getElementById("sandbox-elapsed");
  const reason = document.getElementById("sandbox-reason");
  const advice = document.getElementById("sandbox-advice");
  const wakeButton = document.getElementById("sandbox-wake");
  const browser = document.getElementById("files-browser");

  let sandbox = { state: panel.dataset.sandboxState, failure_reason: panel.dataset.sandboxProblem };
  let pollTimer = null;
  let changingSince = null;
  let listingPending = false;
  let listingAgain = false; // a file changed while a listing was under way
  // Numbers of the latest listing, preview and state asked for (or set): older answers
  // are dropped.
  let listingAsked = 0;
  let previewAsked = 0;
  let stateSet = 0;

  function describe(s) {
    const text = { reason: "", advice: "", button: "" };
    switch (s.state) {
      case "sleeping":
        if (s.failure_reason) {
          text.title = "Your sandbox could not wake up";
          text.text = "Your files are kept in its last snapshot; nothing was lost.";
          text.reason = s.failure_reason;
          text.advice = "Try again. If it keeps failing, tell your administrator what the reason above says.";
          text.button = "Try again";
        } else {
          text.title = "Your sandbox is asleep";
          text.text = "It went to sleep because nobody used it for a while; your files are kept. It wakes when you send a message, or now:";
          text.button = "Wake it up and show the files";
        }
        break;
      case "restoring":
        text.title = "Waking up your sandbox";
        text.text = "Restoring your files from their snapshot. This usually takes a few seconds.";
        break;
      case "provisioning":
        text.title = "Starting your sandbox";
        text.text = "Creating the sandbox. This usually takes a few seconds.";
        break;
      case "snapshotting":
        text.title = "Your sandbox is going to sleep";
        text.text = "Saving your files in a snapshot. Once it sleeps, you can wake it again here.";
        break;
      case "stopping":
        text.title = "Your sandbox is stopping";
        text.text = "Its files are kept.";
        break;
      case "failed":
        text.title = "Your sandbox failed";
        text.text = "Your files are kept.";
        text.reason = s.failure_reason;
        text.advice = "Start it again. If it keeps failing, tell your administrator what the reason above says.";
        text.button = "Start it again";
        break;
      case "unrestorable":
        text.title = "Your workspace could not be restored";
        text.text = "See the notice at the top of the page for what you can do.";
        text.reason = s.failure_reason;
        break;
      default: // absent, stopped
        text.title = "Your sandbox is not running";
        text.text = "It starts when you send a message, or now:";
        text.button = "Start it and show the files";
    }
    return text;
  }

  function showSandbox() {
    const state = sandbox.state;
    stateLabel.textContent = "Sandbox: " + (state === "sleeping" && sandbox.failure_reason ? "could not wake up" : STATE_LABELS[state] || state);
    stateLabel.className = "status status-" + (state === "sleeping" && sandbox.failure_reason ? "failed" : STATUS_CLASSES[state] || "cancelled");
    const running = state === "running";
    show(stateBox, !running);
    show(browser, running);
    if (running) {
      changingSince = null;
      return;
    }
    const text = describe(sandbox);
    if (stateTitle.textContent !== text.title) stateTitle.textContent = text.title;
    if (stateText.textContent !== text.text) stateText.textContent = text.text;
    reason.textContent = text.reason ? "Reason: " + text.reason : "";
    show(reason, Boolean(text.reason));
    advice.textContent = text.advice;
    show(advice, Boolean(text.advice));
    wakeButton.textContent = text.button;
    show(wakeButton, Boolean(text.button));
    stateBox.classList.toggle("sandbox-state-problem", Boolean(text.reason));
    const changing = CHANGING.includes(state);
    if (changing && changingSince === null) changingSince = Date.now();
    if (!changing) changingSince = null;
    show(progress, changing);
    tick();
  }

  function tick() {
    if (changingSince === null) return;
    elapsed.textContent = Math.round((Date.now() - changingSince) / 1000) + " s";
  }
  setInterval(tick, 1000);

  function setSandbox(latest) {
    sandbox = latest;
    stateSet += 1;
  }

  function schedulePoll() {
    clearTimeout(pollTimer);
    pollTimer = null;
    if (document.hidden) return; // asked again when the tab is shown
    let wait = POLL_RESTING_MS;
    if (listingPending || CHANGING.includes(sandbox.state)) wait = POLL_CHANGING_MS;
    else if (sandbox.state === "running") wait = POLL_RUNNING_MS;
    pollTimer = setTimeout(pollSandbox, wait);
  }

  function pollSandbox() {
    const asked = stateSet;
    fetch("/api/v1/sandbox/", { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then((r) => (r.ok ? r.json() : null))
      .then((latest) => {
        // A state set since it was asked (a listing's answer) is newer than this one.
        if (latest && asked === stateSet) {
          const wasRunning = sandbox.state === "running";
          // While a listing wakes the sandbox, "asleep" is the moment before the wake.
          if (!(listingPending && latest.state === "sleeping" && !latest.failure_reason)) setSandbox(latest);
          showSandbox();
          if (sandbox.state === "running" && !wasRunning && !listingPending) loadFiles(currentPath);
        }
        schedulePoll();
      }, schedulePoll);
  }

  document.addEventListener("visibilitychange", () => {
    if (document.hidden) {
      clearTimeout(pollTimer);
      pollTimer = null;
    } else {
      pollSandbox();
    }
  });

  wakeButton.addEventListener("click", () => {
    setSandbox({ state: sandbox.state === "sleeping" ? "restoring" : "provisioning", failure_reason: "" });
    showSandbox();
    loadFiles(currentPath);
  });

  // --- the session's folder --------------------------------------------------------

  const filesBox = document.getElementById("files");
  const pathBox = document.getElementById("files-path");
  const archive = document.getElementById("files-archive");
  const filesProblem = document.getElementById("files-problem");
  const filesNote = document.getElementById("files-note");
  const preview = document.getElementById("preview");
  let currentPath = "";
  let managedNames = {}; // the session folder's entries that are Quor's own, by name
  const changed = new Set(); // paths the stream reported as changed

  function join(path, name) {
    return path ? path + "/" + name : name;
  }

  function isRecent(full, entry) {
    if (changed.has(full)) return true;
    if (entry.type === "directory") {
      for (const path of changed) if (path.startsWith(full + "/")) return true;
      return false;
    }
    return Date.now() / 1000 - entry.modified < RECENT_S;
  }

  function showPath(path) {
    const parts = path ? path.split("/") : [];
    pathBox.replaceChildren();
    const crumbs = [["All files", ""]].concat(parts.map((part, i) => [part, parts.slice(0, i + 1).join("/")]));
    crumbs.forEach(([label, target], i) => {
      const item = el("li");
      if (i === crumbs.length - 1) {
        item.appendChild(el("span", null, label)).setAttribute("aria-current", "location");
      } else {
        const button = el("button", "link", label);
        button.type = "button";
        button.addEventListener("click", () => loadFiles(target));
        item.appendChild(button);
      }
      pathBox.appendChild(item);
    });
    archive.textContent = path ? "Download this folder" : "Download all";
    archive.href = api + "archive?path=" + encodeURIComponent(path);
    const managed = managedNames[parts[0]];
    filesNote.textContent = managed ? MANAGED_LABELS[managed] + ": kept by Quor, changes here are not possible." : "";
    show(filesNote, Boolean(managed));
  }

  function entryRow(path, entry) {
    const full = join(path, entry.name);
    const folder = entry.type === "directory" || entry.managed === "library" || entry.managed === "skills";
    const item = el("li", "file-entry " + (folder ? "is-folder" : "is-file"));
    item.appendChild(el("span", "file-icon")).setAttribute("aria-hidden", "true");
    let name;
    if (folder) {
      name = el("button", "link file-name", entry.name + "/");
      name.type = "button";
      name.addEventListener("click", () => loadFiles(full));
    } else if (entry.type === "file") {
      name = el("a", "file-name", entry.name);
      name.href = api + "content?path=" + encodeURIComponent(full);
      name.addEventListener("click", (e) => { e.preventDefault(); showPreview(full, entry); });
    } else {
      name = el("span", "file-name", entry.name);
    }
    item.appendChild(name);
    const meta = item.appendChild(el("span", "file-meta"));
    if (entry.managed) meta.appendChild(el("span", "file-badge file-managed", MANAGED_LABELS[entry.managed]));
    else if (entry.type === "symlink") meta.appendChild(el("span", "file-badge", "link"));
    if (!entry.managed && isRecent(full, entry)) meta.appendChild(el("span", "file-badge file-recent", "changed"));
    if (entry.type === "file") meta.appendChild(el("span", "file-size", humanSize(entry.size)));
    return item;
  }

  // `open`: a file of this folder the conversation asked to show, if any.
  function showListing(path, listing, open) {
    currentPath = path;
    if (!path) {
      managedNames = {};
      listing.results.forEach((e) => { if (e.managed) managedNames[e.name] = e.managed; });
    }
    showPath(path);
    const visible = listing.results.filter((e) => !e.name.startsWith("."));
    // Folders first, then files, each by name (as the API gives them).
    const rank = (e) => (e.type === "directory" || e.managed === "library" || e.managed === "skills" ? 0 : 1);
    visible.sort((a, b) => rank(a) - rank(b));
    filesBox.replaceChildren(...visible.map((entry) => entryRow(path, entry)));
    if (!visible.length) {
      filesBox.appendChild(el("li", "muted files-empty", path ? "This folder is empty." : "No files yet: what the agent writes appears here."));
    }
    if (listing.truncated) filesBox.appendChild(el("li", "muted", "More entries are not shown."));
    if (open) openListed(path, listing, open);
  }

  // A file named in the conversation, dotfiles included (".env"), even if the folder's
  // listing is cut short; a sentence when it is not there (or not a file).
  function openListed(path, listing, open) {
    const name = open.split("/").pop();
    const entry = listing.results.find((e) => e.name === name);
    let shown = preview;
    if (entry && entry.type === "file") showPreview(open, entry);
    else if (!entry && listing.truncated) showPreview(open, { name: name, size: null });
    else {
      shown = filesProblem;
      if (entry) problem(filesProblem, { code: entry.type === "symlink" ? "files.symlink_refused" : "files.not_a_file", message: open });
      else problem(filesProblem, { code: "files.not_found", message: open + " is not in the session's folder." });
    }
    shown.scrollIntoView({ block: "nearest" });
  }

  function loadFiles(path, open) {
    const asked = ++listingAsked;
    const latest = () => asked === listingAsked;
    listingPending = true;
    listingAgain = false;
    const slow = setTimeout(pollSandbox, SLOW_LISTING_MS);
    show(filesProblem, false);
    fetch(api + "?path=" + encodeURIComponent(path), { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then((r) => {
        if (!latest()) return null;
        if (r.ok) {
          return r.json().then((listing) => {
            if (!latest()) return;
            setSandbox({ state: "running", failure_reason: "" });
            if (path !== currentPath || open) clearPreview();
            showListing(path, listing, open);
          });
        }
        return errorOf(r).then((error) => {
          if (!latest()) return;
          // The sandbox's own refusals are its state, shown by the state box; the
          // cause is on the sandbox's row, which the next poll brings.
          if (error.code === "sandboxes.workspace_unrestorable") {
            setSandbox({ state: "unrestorable", failure_reason: error.message || "" });
            return;
          }
          if (error.code === "sandboxes.unavailable" && sandbox.state !== "running") {
            setSandbox({ state: "sleeping", failure_reason: error.message || "" });
            return;
          }
          problem(filesProblem, error);
        });
      })
      .catch(() => { if (latest()) problem(filesProblem, { code: "sandboxes.unavailable" }); })
      .finally(() => {
        clearTimeout(slow);
        if (!latest()) return; // the latest listing does what follows
        listingPending = false;
        showSandbox();
        if (sandbox.state !== "running") pollSandbox();
        else if (listingAgain) loadFiles(currentPath);
        else schedulePoll();
      });
  }

  function clearPreview() {
    previewAsked += 1;
    preview.replaceChildren();
  }

  // `entry.size` null: not known (the file was not in its folder's listing, cut short).
  function showPreview(path, entry) {
    const url = api + "content?path=" + encodeURIComponent(path);
    clearPreview();
    const asked = previewAsked;
    const head = el("div", "preview-head");
    head.appendChild(el("h3", null, entry.name));
    if (entry.size !== null) head.appendChild(el("span", "muted", humanSize(entry.size)));
    const download = el("a", "button secondary", "Download");
    download.href = url;
    download.setAttribute("download", entry.name);
    head.appendChild(download);
    preview.appendChild(head);
    const box = el("p", "files-problem");
    box.setAttribute("role", "alert");
    box.hidden = true;
    preview.appendChild(box);
    if (entry.size === null) {
      preview.appendChild(el("p", "muted", "Download it to open it."));
    } else if (/\.(png|jpe?g|gif|webp)$/i.test(path)) {
      const img = el("img");
      img.alt = entry.name;
      img.addEventListener("error", () => { img.remove(); problem(box, { code: "files.not_found" }); });
      img.src = url + "&inline=1";
      preview.appendChild(img);
    } else if (entry.size < 200000) {
      fetch(url, { credentials: "same-origin" })
        .then((r) => {
          if (asked !== previewAsked) return null;
          if (!r.ok) return errorOf(r).then((error) => { if (asked === previewAsked) problem(box, error); });
          return r.text().then((text) => { if (asked === previewAsked) preview.appendChild(el("pre", null, text)); });
        })
        .catch(() => { if (asked === previewAsked) problem(box, { code: "sandboxes.unavailable" }); });
    } else {
      preview.appendChild(el("p", "muted", "Too large to show here: download it to open it."));
    }
  }

  // A folder's archive is checked first (`check=1`: measured in the sandbox, nothing
  // made), so that a refusal is a sentence on the page, never the API's JSON in the
  // browser's window; then downloaded by the browser itself, streamed to disk under the
  // server's name (never held in the page's memory).
  archive.addEventListener("click", (e) => {
    e.preventDefault();
    if (archive.getAttribute("aria-disabled") === "true") return;
    const label = archive.textContent;
    const href = archive.href;
    archive.setAttribute("aria-disabled", "true");
    archive.textContent = "Preparing the archive…";
    show(filesProblem, false);
    fetch(href + (href.includes("?") ? "&" : "?") + "check=1", { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then((r) => {
        if (!r.ok) return errorOf(r).then((error) => problem(filesProblem, error));
        const link = el("a");
        link.href = href;
        link.setAttribute("download", "");
        link.hidden = true;
        document.body.appendChild(link);
        link.click();
        link.remove();
        return null;
      })
      .catch(() => problem(filesProblem, { code: "sandboxes.unavailable" }))
      .finally(() => {
        archive.removeAttribute("aria-disabled");
        archive.textContent = label;
      });
  });

  // A file named in the conversation opens here, in its folder, while the sandbox runs;
  // otherwise its link opens it in a new tab.
  document.addEventListener("quor:open-file", (e) => {
    if (sandbox.state !== "running" || !e.detail || !e.detail.path) return;
    e.preventDefault();
    const path = e.detail.path;
    loadFiles(path.split("/").slice(0, -1).join("/"), path);
  });

  document.addEventListener("quor:session-event", (e) => {
    const event = e.detail;
    if (event.kind === "file_changed" && event.payload && event.payload.path) changed.add(event.payload.path);
    if (event.kind === "file_changed" && sandbox.state === "running") {
      // One listing at a time: a change during one lists the folder again after it.
      if (listingPending) listingAgain = true;
      else loadFiles(currentPath);
    }
    // A turn wakes or starts the sandbox: show it happening.
    if (event.kind === "session_started" && sandbox.state !== "running") pollSandbox();
  });

  showSandbox();
  if (sandbox.state === "running") loadFiles("");
  else schedulePoll();
})();
