// The session page: the live event stream over WebSocket, the file browser, web apps.
// Plain JavaScript; text from the agent is always inserted as text or escaped first.
(function () {
  "use strict";
  const root = document.getElementById("session");
  const sessionId = root.dataset.sessionId;
  const eventsBox = document.getElementById("events");
  const statusBox = document.getElementById("status");
  let lastSeq = 0;
  let retryDelay = 1000;
  let liveText = null;

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function escapeHtml(text) {
    return text.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
  }

  // A small, safe Markdown subset: the text is escaped before any markup is added,
  // and links only allow http(s).
  function markdown(text) {
    const blocks = escapeHtml(text).split(/```/);
    return blocks.map((block, i) => {
      if (i % 2 === 1) return "<pre><code>" + block.replace(/^[a-z0-9]*\n/, "") + "</code></pre>";
      return block
        .replace(/`([^`]+)`/g, "<code>$1</code>")
        .replace(/\*\*([^*]+)\*\*/g, "<strong>$1</strong>")
        .replace(/\[([^\]]+)\]\((https?:\/\/[^)\s]+)\)/g, '<a href="$2" rel="noopener noreferrer" target="_blank">$1</a>')
        .replace(/^#{1,3} (.*)$/gm, "<strong>$1</strong>")
        .replace(/^[-*] (.*)$/gm, "• $1")
        .replace(/\n/g, "<br>");
    }).join("");
  }

  function details(summary, body, className) {
    const box = el("details", className);
    box.appendChild(el("summary", null, summary));
    box.appendChild(el("pre", null, body));
    return box;
  }

  const cancelForm = document.getElementById("cancel-form");
  const followUpButton = document.querySelector("#follow-up button");

  // Cancel only while the agent works; follow up only when it does not.
  function setStatus(text, status) {
    statusBox.textContent = text;
    statusBox.className = "status status-" + status;
    const working = status === "running" || status === "pending";
    cancelForm.hidden = !working;
    followUpButton.disabled = working;
  }

  function describeInput(input) {
    // Strings (file contents, commands) read best as they are.
    return Object.entries(input || {}).map(([key, value]) =>
      typeof value === "string" && value.includes("\n") ? key + ":\n" + value : key + ": " + (typeof value === "string" ? value : JSON.stringify(value))
    ).join("\n");
  }

  // The agent message being streamed into, started on its first delta.
  function agentMessage() {
    if (!liveText) {
      liveText = el("div", "message assistant");
      liveText.appendChild(el("div", "who", "Agent"));
      liveText.appendChild(el("div", "text"));
      liveText.raw = "";
      eventsBox.appendChild(liveText);
    }
    return liveText;
  }

  // Approvals: the egress proxy parks a request of the agent that needs the user's yes,
  // and the agent waits until the card below is answered. A card is built from data
  // only as text; there is one card per approval id whichever way its state arrives
  // (backlog, live event, the decision's own answer), and a decided card never goes
  // back to pending. The countdown uses this browser's clock.
  const approvals = new Map();
  const alertBox = document.getElementById("approval-alert");
  const alertText = document.getElementById("approval-alert-text");
  const alertShow = document.getElementById("approval-alert-show");
  const pageTitle = document.title;
  let countdownTimer = null;

  const DECISIONS = [
    ["approve_once", "Approve once", "approve"],
    ["approve_session", "Approve for this session", "approve-session"],
    ["reject", "Reject", "reject"],
  ];
  const POLICIES = { ask: "Ask", auto: "Auto-approve", deny: "Deny" };

  function csrfToken() {
    const input = document.querySelector("input[name=csrfmiddlewaretoken]");
    return input ? input.value : "";
  }

  function expiresAt(a) {
    const time = Date.parse(a.expires_at || "");
    return Number.isNaN(time) ? null : time;
  }

  function remaining(ms) {
    const total = Math.max(0, Math.ceil(ms / 1000));
    const h = Math.floor(total / 3600);
    const m = Math.floor((total % 3600) / 60);
    const s = String(total % 60).padStart(2, "0");
    return h ? h + ":" + String(m).padStart(2, "0") + ":" + s : m + ":" + s;
  }

  function outcomeText(a) {
    const via = a.decided_via;
    switch (a.status) {
      case "approved":
        return via === "session_grant" ? "Approved for this session" : via === "user" ? "Approved once" : "Approved";
      case "rejected":
        return via === "cancel" ? "Rejected: the turn was cancelled" : via === "proxy" ? "Rejected by the proxy" : "Rejected";
      case "expired":
        return via === "cancel" ? "Expired: the turn was cancelled" : "Expired";
      default:
        return "";
    }
  }

  // "pending" (buttons shown), or final: the server's status, "expired" when the expiry
  // passed here or the server said so, "closed" when the server refused a decision.
  function approvalState(entry) {
    const a = entry.data;
    if (a.status !== "pending") return a.status;
    if (entry.closed) return entry.closed;
    const expiry = expiresAt(a);
    return expiry !== null && expiry <= Date.now() ? "expired" : "pending";
  }

  // What "Approve for this session" allows when the request matched a synthetic action
  // (apps/policy.py): "any" is every request to a custom App, "uncataloged" every request
  // to a built-in App outside its catalog. "" for cataloged actions.
  function broadScope(actions, appName) {
    const keys = actions.map((action) => action && action.key);
    if (keys.includes("any")) return "This allows every request to " + appName + " in this session.";
    if (keys.includes("uncataloged")) return "This allows every request to " + appName + " outside its catalog in this session.";
    return "";
  }

  function buildApprovalCard(a) {
    const card = el("section", "approval approval-pending");
    card.tabIndex = -1;
    const titleId = "approval-title-" + approvals.size;
    card.setAttribute("aria-labelledby", titleId);
    card.dataset.approvalId = a.id;

    const head = el("div", "approval-head");
    const title = el("h2", "approval-title");
    title.id = titleId;
    head.appendChild(title);
    const countdown = el("time", "approval-countdown");
    countdown.setAttribute("aria-live", "off");
    if (a.expires_at) countdown.dateTime = a.expires_at;
    head.appendChild(countdown);
    card.appendChild(head);

    card.appendChild(el("p", "approval-summary", a.summary || ""));
    const request = el("p", "approval-request");
    request.appendChild(el("span", "approval-method", a.method || ""));
    request.appendChild(document.createTextNode(" "));
    request.appendChild(el("code", "approval-url", a.url || ""));
    card.appendChild(request);

    const actions = Array.isArray(a.actions) ? a.actions : [];
    if (actions.length) {
      const list = el("ul", "approval-matched");
      list.setAttribute("aria-label", "Matched actions");
      actions.forEach((action) => {
        const item = el("li");
        item.appendChild(el("span", null, action.name || action.key || ""));
        if (action.key) item.appendChild(el("code", null, action.key));
        if (POLICIES[action.policy]) item.appendChild(el("span", "policy policy-" + action.policy, POLICIES[action.policy]));
        list.appendChild(item);
      });
      card.appendChild(list);
    }

    const entry = { card, data: a, title, countdown, closed: null, busy: false, buttons: [] };
    const buttonRow = el("div", "approval-buttons");
    buttonRow.setAttribute("role", "group");
    buttonRow.setAttribute("aria-label", "Decision");
    DECISIONS.forEach(([decision, label, className]) => {
      const button = el("button", className, label);
      button.type = "button";
      button.onclick = () => decide(entry, decision);
      buttonRow.appendChild(button);
      entry.buttons.push(button);
    });
    const hint = el("p", "approval-hint", "“Approve for this session” also lets later requests for these actions in this session pass without asking.");
    // The synthetic actions cover a whole App (custom App) or all of a built-in App
    // outside its catalog: approving them for the session is much broader, so say so.
    const broad = broadScope(actions, a.app || "this App");
    if (broad) {
      hint.className = "approval-hint approval-hint-broad";
      hint.textContent = "“Approve for this session”: ";
      hint.appendChild(el("strong", null, broad));
    }
    hint.id = titleId + "-hint";
    entry.buttons[1].setAttribute("aria-describedby", hint.id);
    entry.buttonRow = buttonRow;
    entry.hint = hint;
    card.appendChild(buttonRow);
    card.appendChild(hint);

    entry.error = el("p", "approval-error");
    entry.error.setAttribute("role", "alert");
    entry.error.tabIndex = -1;
    card.appendChild(entry.error);
    entry.outcome = el("p", "approval-outcome");
    entry.outcome.setAttribute("role", "status");
    entry.outcome.tabIndex = -1;
    card.appendChild(entry.outcome);
    return entry;
  }

  function updateApprovalCard(entry) {
    const state = approvalState(entry);
    const a = entry.data;
    entry.card.className = "approval approval-" + state;
    entry.title.textContent = (state === "pending" ? "Approval needed · " : "Approval request · ") + (a.app || "App");
    if (state === "pending") {
      const expiry = expiresAt(a);
      entry.countdown.textContent = expiry === null ? "" : "Expires in " + remaining(expiry - Date.now());
      // aria-disabled, not disabled: a disabled button would lose the keyboard focus.
      entry.buttons.forEach((button) => button.setAttribute("aria-disabled", String(entry.busy)));
      return;
    }
    entry.countdown.textContent = "";
    let text = state === "closed" ? "" : a.status === "pending" ? "Expired" : outcomeText(a);
    if (a.decided_at && a.status !== "pending") {
      const decided = new Date(a.decided_at);
      if (!Number.isNaN(decided.getTime())) text += " · " + decided.toLocaleTimeString();
    }
    if (entry.outcome.textContent !== text) entry.outcome.textContent = text;
    if (entry.buttonRow.isConnected) {
      // The buttons go; keyboard focus on one of them moves to what the card now says.
      const hadFocus = entry.buttonRow.contains(document.activeElement);
      entry.buttonRow.remove();
      entry.hint.remove();
      if (hadFocus) (text ? entry.outcome : entry.error.textContent ? entry.error : entry.card).focus();
    }
  }

  function updateApprovalAlert() {
    const pending = [...approvals.values()].filter((entry) => approvalState(entry) === "pending");
    alertBox.hidden = pending.length === 0;
    alertText.textContent = pending.length === 1
      ? "The agent is waiting for your approval."
      : "The agent is waiting for your approval of " + pending.length + " requests.";
    document.title = pending.length ? "(" + pending.length + ") Approval needed · " + pageTitle : pageTitle;
    if (pending.length && !countdownTimer) {
      countdownTimer = setInterval(() => {
        approvals.forEach((entry) => { if (entry.card.classList.contains("approval-pending")) updateApprovalCard(entry); });
        updateApprovalAlert();
      }, 1000);
    } else if (!pending.length && countdownTimer) {
      clearInterval(countdownTimer);
      countdownTimer = null;
    }
    return pending;
  }

  // An approval's latest state, from an event or a decision's answer.
  function showApproval(a) {
    if (!a || typeof a.id !== "string") return;
    let entry = approvals.get(a.id);
    if (!entry) {
      entry = buildApprovalCard(a);
      approvals.set(a.id, entry);
      eventsBox.appendChild(entry.card);
      liveText = null;
    } else if (a.status === "pending" && entry.data.status !== "pending") {
      return; // already decided: an older state arrived late
    } else {
      entry.data = a;
    }
    updateApprovalCard(entry);
    updateApprovalAlert();
  }

  function errorMessage(body, status) {
    const error = body && body.error;
    if (error && typeof error.message === "string" && error.message) return error.message;
    return "Could not send your decision (HTTP " + status + "). Try again.";
  }

  function decide(entry, decision) {
    if (entry.busy || approvalState(entry) !== "pending") return;
    entry.busy = true;
    entry.error.textContent = "";
    updateApprovalCard(entry);
    fetch("/api/v1/approvals/" + encodeURIComponent(entry.data.id) + "/decision/", {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", Accept: "application/json", "X-CSRFToken": csrfToken() },
      body: JSON.stringify({ decision }),
    })
      .then((response) => response.json().catch(() => null).then((body) => ({ response, body })))
      .then(({ response, body }) => {
        entry.busy = false;
        if (response.ok && body && body.id === entry.data.id) {
          showApproval(body);
          return;
        }
        if (entry.data.status !== "pending") return; // decided meanwhile: the card says how
        entry.error.textContent = errorMessage(body, response.status);
        // Decided elsewhere, expired or gone: no decision can be made here any more.
        if (response.status === 409 || response.status === 404) {
          entry.closed = body && body.error && body.error.code === "approvals.expired" ? "expired" : "closed";
        }
        updateApprovalCard(entry);
        updateApprovalAlert();
      })
      .catch(() => {
        entry.busy = false;
        entry.error.textContent = "Could not reach Quor. Check your connection and try again.";
        updateApprovalCard(entry);
      });
  }

  alertShow.onclick = () => {
    const first = updateApprovalAlert()[0];
    if (!first) return;
    first.card.scrollIntoView({ behavior: "smooth", block: "center" });
    first.buttons[0].focus({ preventScroll: true });
  };

  // Web apps: servers the agent started. Each is previewed in a sandboxed iframe whose
  // document stays an opaque origin; it loads Quor's /webapps/<label>/open, which hands
  // the viewer off to the app's own origin. Built from event data as text and attributes.
  const webappsBox = document.getElementById("webapps");
  const webappList = document.getElementById("webapp-list");
  const loadedSeq = Number(root.dataset.lastSeq) || 0; // web apps up to here are on the page
  const PREVIEW_SANDBOX = "allow-scripts allow-forms allow-top-navigation-by-user-activation";

  function openUrl(w) {
    return typeof w.open_url === "string" && /^\/webapps\/[A-Za-z0-9_-]+\/open$/.test(w.open_url) ? w.open_url : null;
  }

  function showWebApp(w, seq) {
    const url = w && typeof w.id === "string" ? openUrl(w) : null;
    if (!url) return;
    let item = [...webappList.children].find((li) => li.dataset.webappId === w.id);
    const isNew = !item;
    if (isNew) {
      item = el("li", "webapp");
      item.dataset.webappId = w.id;
      const head = el("div", "webapp-head");
      head.appendChild(el("strong", "webapp-port"));
      head.appendChild(el("code", "webapp-command"));
      const link = el("a", "webapp-open", "Open in a new tab");
      link.href = url.replace(/open$/, ""); // Quor's full-window viewer of the app
      link.target = "_blank";
      link.rel = "noopener noreferrer";
      head.appendChild(link);
      item.appendChild(head);
      const frame = el("iframe", "webapp-preview");
      frame.setAttribute("sandbox", PREVIEW_SANDBOX); // before it loads anything
      frame.loading = "lazy";
      frame.src = url;
      item.appendChild(frame);
      webappList.appendChild(item);
    }
    item.querySelector(".webapp-port").textContent = "Port " + w.port;
    item.querySelector(".webapp-command").textContent = typeof w.command === "string" ? w.command : "";
    const frame = item.querySelector("iframe");
    frame.title = "Preview of the web app on port " + w.port;
    // Started again after this page was loaded: show the new server.
    if (!isNew && seq > loadedSeq) frame.src = url;
    webappsBox.hidden = false;
  }

  // The sharing switch: a plain form (it works without this script); saved on change.
  const sharingForm = document.getElementById("sharing-form");
  if (sharingForm) {
    const save = sharingForm.querySelector("button[type=submit]");
    if (save) save.hidden = true;
    sharingForm.addEventListener("change", () => {
      if (sharingForm.requestSubmit) sharingForm.requestSubmit();
      else sharingForm.submit();
    });
  }

  function render(event) {
    const p = event.payload || {};
    const nearBottom = window.innerHeight + window.scrollY >= document.body.scrollHeight - 200;
    switch (event.kind) {
      case "user_message": {
        const box = el("div", "message user");
        box.appendChild(el("div", "who", "You"));
        box.appendChild(el("div", "text", p.text));
        if (p.attachments && p.attachments.length) box.appendChild(el("div", "note", "Attached: " + p.attachments.join(", ")));
        eventsBox.appendChild(box);
        liveText = null;
        break;
      }
      case "session_started":
        setStatus("Running", "running");
        break;
      case "assistant_text_delta":
        agentMessage().raw += p.text;
        liveText.lastChild.innerHTML = markdown(liveText.raw);
        break;
      case "assistant_text":
        agentMessage().lastChild.innerHTML = markdown(p.text || "");
        liveText = null;
        break;
      case "tool_call":
        eventsBox.appendChild(details(p.name, describeInput(p.input), "tool call"));
        liveText = null;
        break;
      case "tool_result":
        eventsBox.appendChild(details((p.is_error ? "✗ " : "✓ ") + p.name + " output", p.output || "", "tool result" + (p.is_error ? " failed" : "")));
        break;
      case "file_changed":
        eventsBox.appendChild(el("div", "note", "File changed: " + p.path));
        loadFiles(currentPath);
        break;
      case "error":
        eventsBox.appendChild(el("div", "error-box", (p.message || "Error") + (p.code ? " (" + p.code + ")" : "")));
        setStatus("Failed", "failed");
        break;
      case "turn_finished": {
        const usage = p.usage || {};
        eventsBox.appendChild(el("div", "note", "Finished · " + (usage.input_tokens || 0) + " tokens in, " + (usage.output_tokens || 0) + " out"));
        setStatus("Waiting for input", "waiting");
        break;
      }
      case "approval_requested":
      case "approval_decided":
        showApproval(p.approval);
        break;
      case "webapp_started":
        if (p.webapp) {
          eventsBox.appendChild(el("div", "note", "Web app started on port " + p.webapp.port));
          showWebApp(p.webapp, event.seq);
        }
        break;
      case "cancelled":
        eventsBox.appendChild(el("div", "note", "Cancelled"));
        setStatus("Cancelled", "cancelled");
        break;
      default:
        break;
    }
    if (nearBottom) window.scrollTo(0, document.body.scrollHeight);
  }

  function connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const socket = new WebSocket(scheme + "://" + location.host + "/ws/sessions/" + sessionId + "/?after=" + lastSeq);
    socket.onmessage = (message) => {
      const event = JSON.parse(message.data);
      if (event.seq <= lastSeq) return;
      lastSeq = event.seq;
      render(event);
    };
    socket.onopen = () => { retryDelay = 1000; };
    socket.onclose = (close) => {
      if (close.code === 4401 || close.code === 4404) return;
      setTimeout(connect, retryDelay);
      retryDelay = Math.min(retryDelay * 2, 15000);
    };
  }

  // Files: the session workspace through the authenticated files API.
  const filesBox = document.getElementById("files");
  const pathBox = document.getElementById("files-path");
  const preview = document.getElementById("preview");
  let currentPath = "";
  const api = "/api/v1/sessions/" + sessionId + "/files/";

  function loadFiles(path) {
    currentPath = path;
    pathBox.textContent = "/" + path;
    preview.replaceChildren();
    fetch(api + "?path=" + encodeURIComponent(path), { credentials: "same-origin" })
      .then((r) => (r.ok ? r.json() : { results: [] }))
      .then((listing) => {
        const entries = listing.results;
        filesBox.replaceChildren();
        if (path) {
          const up = el("li");
          const link = el("a", null, "..");
          link.href = "#";
          link.onclick = (e) => { e.preventDefault(); loadFiles(path.split("/").slice(0, -1).join("/")); };
          up.appendChild(link);
          filesBox.appendChild(up);
        }
        entries.filter((e) => !e.name.startsWith(".")).forEach((entry) => {
          const item = el("li");
          const full = path ? path + "/" + entry.name : entry.name;
          const link = el("a", null, entry.name + (entry.type === "directory" ? "/" : ""));
          if (entry.type === "directory") {
            link.href = "#";
            link.onclick = (e) => { e.preventDefault(); loadFiles(full); };
          } else {
            link.href = api + "content?path=" + encodeURIComponent(full);
            link.onclick = (e) => { e.preventDefault(); showPreview(full, entry); };
          }
          item.appendChild(link);
          if (entry.type === "file") item.appendChild(el("span", "muted", " " + entry.size + " B"));
          filesBox.appendChild(item);
        });
        if (listing.truncated) {
          filesBox.appendChild(el("li", "muted", "More entries are not shown."));
        }
      });
  }

  function showPreview(path, entry) {
    const url = api + "content?path=" + encodeURIComponent(path);
    preview.replaceChildren();
    const download = el("a", "button", "Download " + entry.name);
    download.href = url;
    preview.appendChild(download);
    if (/\.(png|jpe?g|gif|webp)$/i.test(path)) {
      const img = el("img");
      img.src = url + "&inline=1";
      img.alt = entry.name;
      preview.appendChild(img);
    } else if (entry.size < 200000) {
      fetch(url, { credentials: "same-origin" }).then((r) => r.text()).then((text) => preview.appendChild(el("pre", null, text)));
    }
  }

  setStatus(statusBox.textContent, root.dataset.status);
  connect();
  loadFiles("");
})();
