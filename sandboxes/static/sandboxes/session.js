// The session page: the live event stream over WebSocket (conversation, tool cards,
// approvals, web apps), and the composer, which sends follow-ups and cancels in place.
// Plain JavaScript. Text from the agent goes in as text, except its Markdown, which is
// rendered with HTML escaped and then sanitized (DOMPurify) before it reaches the page.
(function () {
  "use strict";
  const { el, humanSize } = window.Quor;
  const root = document.getElementById("session");
  const sessionId = root.dataset.sessionId;
  const api = "/api/v1/sessions/" + encodeURIComponent(sessionId) + "/";
  const eventsBox = document.getElementById("events");
  const statusBox = document.getElementById("status");
  const workingBox = document.getElementById("working");
  const workingText = document.getElementById("working-text");
  const announcer = document.getElementById("announcer");
  const loadedSeq = Number(root.dataset.lastSeq) || 0; // events up to here were on the page at load
  let lastSeq = 0;
  let retryDelay = 1000;
  let liveText = null;
  let status = root.dataset.status;

  // The statuses' names for people (the same words as Session.Status's labels).
  const STATUS_LABELS = {
    pending: "Starting",
    running: "Working",
    waiting: "Done",
    finished: "Done",
    failed: "Failed",
    cancelled: "Stopped by you",
  };

  function escapeHtml(text) {
    return String(text).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
  }

  function csrfToken() {
    const input = document.querySelector("input[name=csrfmiddlewaretoken]");
    return input ? input.value : "";
  }

  function postJson(url, body) {
    return fetch(url, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", Accept: "application/json", "X-CSRFToken": csrfToken() },
      body: JSON.stringify(body),
    }).then((response) => response.json().catch(() => null).then((data) => ({ response, body: data })));
  }

  // The API's message for people in an error answer, or `fallback`.
  function apiError(body, fallback) {
    const error = body && body.error;
    return error && typeof error.message === "string" && error.message ? error.message : fallback;
  }

  // Screen readers hear whole messages and outcomes, never each streamed piece; and
  // nothing of the backlog that was on the page when it loaded.
  function announce(event, text) {
    if (event.seq > loadedSeq && text) announcer.textContent = text;
  }

  // --- Markdown ---------------------------------------------------------------------
  // The model's HTML is escaped by marked's renderer and anything else DOMPurify does
  // not allow is dropped. Images become links: a remote image would load by itself and
  // could carry data out in its URL. Only http(s) and mailto links survive.
  const MARKDOWN_TAGS = ["a", "p", "br", "hr", "h1", "h2", "h3", "h4", "h5", "h6", "strong", "em", "del",
    "code", "pre", "blockquote", "ul", "ol", "li", "table", "thead", "tbody", "tr", "th", "td", "span"];
  const LINK_SCHEMES = /^(?:https?:|mailto:)/i;
  const markdownReady = typeof window.marked !== "undefined" && typeof window.DOMPurify !== "undefined";
  const markdownParser = markdownReady ? new window.marked.Marked({
    gfm: true,
    breaks: true,
    renderer: {
      html(token) { return escapeHtml(token.text); },
      image(token) { return '<a href="' + escapeHtml(token.href || "") + '">' + escapeHtml(token.text || token.href || "image") + "</a>"; },
    },
  }) : null;

  // Highlighting is slow on large code: above this size it stays plain text.
  const HIGHLIGHT_MAX_CHARS = 100000;

  function highlight(code, language) {
    const hljs = window.hljs;
    if (!hljs || !language || !hljs.getLanguage(language)) return;
    if (code.textContent.length > HIGHLIGHT_MAX_CHARS) return;
    code.classList.add("language-" + language);
    hljs.highlightElement(code); // works on the element's text and escapes it again
  }

  // Code blocks are highlighted once a message is complete (`highlightCode`), never at
  // each streamed piece.
  function renderMarkdown(target, text, highlightCode) {
    if (!markdownReady) {
      target.textContent = text;
      return;
    }
    const fragment = window.DOMPurify.sanitize(markdownParser.parse(text), {
      ALLOWED_TAGS: MARKDOWN_TAGS,
      ALLOWED_ATTR: ["href", "title", "class", "start"],
      ALLOWED_URI_REGEXP: LINK_SCHEMES,
      RETURN_DOM_FRAGMENT: true,
    });
    fragment.querySelectorAll("a").forEach((link) => {
      const href = link.getAttribute("href");
      if (!href || !LINK_SCHEMES.test(href)) {
        link.replaceWith(...link.childNodes);
        return;
      }
      link.target = "_blank";
      link.rel = "noopener noreferrer";
    });
    fragment.querySelectorAll("pre code").forEach((code) => {
      const match = /(?:^|\s)language-([\w+-]+)/.exec(code.className);
      code.className = "";
      if (highlightCode) highlight(code, match && match[1]);
    });
    target.replaceChildren(fragment);
  }

  // --- The agent's messages -----------------------------------------------------------
  // The message being streamed into, started on its first delta; drawn at most once a
  // frame, and marked busy for assistive technology until it is complete.
  let drawPending = false;

  function agentMessage() {
    if (!liveText) {
      liveText = el("div", "message assistant");
      liveText.appendChild(el("div", "who", "Agent"));
      liveText.appendChild(el("div", "text markdown"));
      liveText.raw = "";
      eventsBox.appendChild(liveText);
      eventsBox.setAttribute("aria-busy", "true");
    }
    return liveText;
  }

  function drawLiveText() {
    drawPending = false;
    if (liveText) renderMarkdown(liveText.lastChild, liveText.raw, false);
  }

  function endAgentMessage() {
    // A message that ended without its complete text (an error, a stop): what arrived
    // of it, drawn once more with its code highlighted.
    if (liveText && !liveText.complete) renderMarkdown(liveText.lastChild, liveText.raw, true);
    liveText = null;
    eventsBox.setAttribute("aria-busy", "false");
  }

  // --- Tool calls: one card each, written for people ----------------------------------
  const toolCards = new Map(); // call id -> card
  let openTool = null; // the card whose call has no result yet
  const writtenPaths = new Set();
  const PREVIEW_LINES = 6;

  // A path the Files panel can open: relative to the session's directory.
  function sessionPath(path) {
    if (typeof path !== "string" || !path || path.startsWith("/") || path.split("/").includes("..")) return null;
    return path.replace(/^(\.\/)+/, "");
  }

  // A real link to the file, and a page event the Files panel answers (it calls
  // preventDefault() when it shows the file itself).
  function fileLink(path) {
    const relative = sessionPath(path);
    if (!relative) return el("code", null, path || "a file");
    const link = el("a", "file-link", relative);
    link.href = api + "files/content?path=" + encodeURIComponent(relative);
    link.target = "_blank";
    link.rel = "noopener";
    link.addEventListener("click", (click) => {
      const open = new CustomEvent("quor:open-file", { detail: { path: relative }, cancelable: true });
      if (!document.dispatchEvent(open)) click.preventDefault();
    });
    return link;
  }

  function extensionOf(path) {
    const match = /\.([A-Za-z0-9]+)$/.exec(path || "");
    return match ? match[1].toLowerCase() : null;
  }

  // A box that may scroll can be scrolled with the keyboard too.
  function scrollable(node) {
    node.tabIndex = 0;
    return node;
  }

  function more(summary, ...content) {
    const box = el("details", "tool-more");
    box.appendChild(el("summary", null, summary));
    content.forEach((node) => box.appendChild(node.tagName === "PRE" ? scrollable(node) : node));
    return box;
  }

  // A file's content behind a toggle, highlighted the first time it is opened (a closed
  // card costs nothing, in the backlog too).
  function codeMore(summary, text, language) {
    const pre = el("pre", "tool-code");
    const code = el("code", null, text);
    pre.appendChild(code);
    const box = more(summary, pre);
    box.addEventListener("toggle", function opened() {
      if (!box.open) return;
      box.removeEventListener("toggle", opened);
      highlight(code, language);
    });
    return box;
  }

  // The first lines inline, all of it one click away.
  function outputBlock(card, text, emptyText) {
    const lines = text.replace(/\n+$/, "").split("\n");
    if (!text.trim()) {
      card.body.appendChild(el("p", "tool-empty", emptyText || "No output."));
      return;
    }
    card.body.appendChild(el("pre", "tool-preview", lines.slice(0, PREVIEW_LINES).join("\n")));
    if (lines.length > PREVIEW_LINES) card.body.appendChild(more("Show all " + lines.length + " lines", el("pre", "tool-full", text)));
  }

  function setTitle(card, ...parts) {
    card.heading.replaceChildren(...parts.map((part) => (typeof part === "string" ? document.createTextNode(part) : part)));
  }

  function badge(card, text) {
    card.head.appendChild(el("span", "tool-badge", text));
  }

  const TOOL_TITLES = {
    run_command: (input, done) => [done ? "Ran " : "Running ", el("code", null, input.command || "")],
    write_file: (input, done, card) => {
      const bytes = new TextEncoder().encode(input.content || "").length;
      const verb = card.existed ? (done ? "Updated " : "Updating ") : done ? "Created " : "Creating ";
      return [verb, fileLink(card.path || input.path), " · " + humanSize(bytes)];
    },
    edit_file: (input, done, card) => [done ? "Edited " : "Editing ", fileLink(card.path || input.path)],
    read_file: (input, done, card) => [done ? "Read " : "Reading ", fileLink(card.path || input.path)],
    list_files: (input, done) => [done ? "Listed " : "Listing ", input.path ? el("code", null, input.path) : "the working directory"],
    start_web_app: (input, done) => [(done ? "Started" : "Starting") + " a web app on port " + input.port + ": ", el("code", null, input.command || "")],
    search_company_knowledge: (input, done) => [(done ? "Searched" : "Searching") + " company knowledge for ", el("q", null, input.query || "")],
  };

  function toolTitle(card, done) {
    const title = TOOL_TITLES[card.name];
    if (title) return title(card.input, done, card);
    return [(done ? "Used " : "Using ") + "the tool ", el("code", null, card.name || "?")];
  }

  function showToolCall(p) {
    const input = p.input && typeof p.input === "object" ? p.input : {};
    const path = sessionPath(input.path);
    const name = String(p.name || "");
    const card = {
      node: el("article", "tool tool-running"),
      head: el("div", "tool-head"),
      heading: el("p", "tool-title"),
      body: el("div", "tool-body"),
      name,
      input,
      path,
      existed: path ? writtenPaths.has(path) : false,
      changed: [],
    };
    if (path && (name === "write_file" || name === "edit_file")) writtenPaths.add(path);
    card.head.appendChild(card.heading);
    card.node.appendChild(card.head);
    card.node.appendChild(card.body);
    setTitle(card, ...toolTitle(card, false));
    toolCards.set(p.id, card);
    openTool = card;
    eventsBox.appendChild(card.node);
  }

  const EXIT_CODE = /\n?\[exit code: (-?\d+)\]\s*$/;
  const TIMED_OUT = /\n?\[timed out after (\d+) seconds: the command was killed\]\s*$/;

  function showToolResult(p) {
    let card = toolCards.get(p.id);
    if (!card) {
      showToolCall({ id: p.id, name: p.name, input: {} });
      card = toolCards.get(p.id);
    }
    if (openTool === card) openTool = null;
    card.node.classList.remove("tool-running");
    setTitle(card, ...toolTitle(card, true));
    let output = typeof p.output === "string" ? p.output : "";
    const failed = Boolean(p.is_error);
    if (failed) card.node.classList.add("tool-failed");
    if (card.name === "run_command") {
      const exit = EXIT_CODE.exec(output);
      const timeout = TIMED_OUT.exec(output);
      if (exit) {
        output = output.slice(0, exit.index);
        if (exit[1] !== "0") badge(card, "Exit code " + exit[1]);
      } else if (timeout) {
        output = output.slice(0, timeout.index);
        badge(card, "Stopped after " + timeout[1] + " s");
      } else if (failed) {
        badge(card, "Failed");
      }
      outputBlock(card, output, "No output.");
    } else if (failed) {
      badge(card, "Failed");
      outputBlock(card, output.replace(/^Error: /, ""));
    } else if (card.name === "write_file") {
      card.body.appendChild(codeMore("Show content", card.input.content || "", extensionOf(card.path)));
    } else if (card.name === "edit_file") {
      const change = el("pre", "tool-diff");
      change.appendChild(el("del", null, card.input.old || ""));
      change.appendChild(el("ins", null, card.input.new || ""));
      card.body.appendChild(more("Show the change", change));
    } else if (card.name === "read_file" || card.name === "list_files") {
      const lines = output.replace(/\n+$/, "").split("\n").length;
      card.body.appendChild(more("Show what it " + (card.name === "read_file" ? "read" : "listed") + " (" + lines + (lines === 1 ? " line)" : " lines)"), el("pre", "tool-full", output)));
    } else if (card.name === "search_company_knowledge") {
      const found = (output.match(/^\d+\. /gm) || []).length;
      card.body.appendChild(more(found ? "Show the " + found + (found === 1 ? " document" : " documents") + " found" : "Nothing found", el("pre", "tool-full", output)));
    } else if (card.name === "start_web_app") {
      // The web app's own card (webapp_started) shows it; the output is for the agent.
    } else {
      card.body.appendChild(more("Show input and output", el("pre", "tool-full", JSON.stringify(card.input, null, 2)), el("pre", "tool-full", output)));
    }
    const others = card.changed.filter((path) => path !== card.path);
    if (others.length) {
      const changed = el("p", "tool-changed", "Changed: ");
      others.forEach((path, i) => {
        if (i) changed.appendChild(document.createTextNode(", "));
        changed.appendChild(fileLink(path));
      });
      card.body.appendChild(changed);
    }
  }

  function fileChanged(p) {
    const path = sessionPath(p.path);
    if (!path) return;
    writtenPaths.add(path);
    if (openTool && !openTool.changed.includes(path)) openTool.changed.push(path);
    else if (!openTool) eventsBox.appendChild(el("p", "note", "Changed " + path));
  }

  // --- Errors: a sentence for people; the code and the original text behind a toggle ---
  // The original message may be written for the agent ("do not retry it, ..."): it is
  // only ever shown as technical detail.
  const ERROR_SENTENCES = {
    "model.unauthorized": "The model provider refused Quor's credentials. An admin of your organization needs to check the model provider's API key.",
    "model.rate_limited": "The model provider is limiting requests right now. Wait a minute, then send a follow-up to continue.",
    "model.unavailable": "The model provider could not be reached or is having trouble. Send a follow-up in a few minutes to continue.",
    "model.timeout": "The model provider stopped answering. Send a follow-up to try again.",
    "model.bad_response": "The model provider sent an answer Quor could not read. Send a follow-up to try again.",
    "model.bad_request": "The model provider refused the request: the conversation may be too long for the model. Start a new session, or ask an admin to check the model.",
    "agent.sandbox_unavailable": "Your sandbox could not be started. Send a follow-up to try again.",
    "agent.timeout": "The agent worked longer than one turn may take and was stopped. Send a follow-up to let it continue.",
    "agent.crashed": "The agent stopped unexpectedly. Send a follow-up to try again.",
    "agent.lost": "Quor lost contact with the agent, so this turn was ended. Send a follow-up to try again.",
    "runtime.misconfigured": "The agent is not set up correctly on this Quor server. Ask an admin to check its configuration.",
    "runtime.crashed": "The agent stopped because of an error in Quor. Send a follow-up to try again; if it happens again, tell an admin.",
    "approvals.expired": "Nobody answered the approval request in time, so the agent stopped. Send a follow-up to try again.",
    "approvals.unavailable": "Approvals are not working right now, so the request that needed one was not sent. Try again in a few minutes.",
    "egress.credential_unavailable": "Quor has no credentials for the model provider right now, so the agent could not continue. An admin of your organization needs to check the model provider's API key.",
    "egress.not_ready": "Quor's network proxy was starting, so the agent could not reach the model provider. Send a follow-up in a minute to try again.",
    "sandboxes.workspace_unrestorable": "Your workspace could not be restored, so the agent could not start. See the notice at the top of this page (reload the page if it is not there): follow-ups wait until you decide there how to go on.",
  };
  const ERROR_FALLBACK = "Something went wrong and the agent stopped. Send a follow-up to try again.";

  function errorSentence(code) {
    if (ERROR_SENTENCES[code]) return ERROR_SENTENCES[code];
    if (/^apps\./.test(code || "")) return "The rules of an App that covers the model provider's address refused the agent's request to the model, so it stopped. Ask an admin of your organization to check the App.";
    if (/^egress\./.test(code || "")) return "Quor's network rules refused the agent's request to the model provider, so it stopped. Ask an admin of your organization to check them.";
    return ERROR_FALLBACK;
  }

  function showError(p) {
    const box = el("div", "stream-error");
    const code = typeof p.code === "string" ? p.code : "";
    box.appendChild(el("p", "stream-error-text", errorSentence(code)));
    const detail = el("details", "stream-error-details");
    detail.appendChild(el("summary", null, "Technical details"));
    const list = el("dl");
    [["Code", code || "(none)"], ["Message", typeof p.message === "string" ? p.message : ""]].forEach(([name, value]) => {
      list.appendChild(el("dt", null, name));
      list.appendChild(el("dd", null, value));
    });
    detail.appendChild(list);
    box.appendChild(detail);
    eventsBox.appendChild(box);
    return errorSentence(code);
  }

  function finishedText(p) {
    const usage = p.usage || {};
    const tokens = (usage.input_tokens || 0).toLocaleString() + " tokens in, " + (usage.output_tokens || 0).toLocaleString() + " out";
    switch (p.stop_reason) {
      case "approval_rejected":
        return ["Rejected by you: the agent stopped here.", tokens];
      case "max_steps":
        return ["Stopped after " + (p.steps || "the most") + " steps, the most one turn may take. Send a follow-up to let it continue.", tokens];
      case "max_tokens":
        return ["Done, though the last answer reached the model's length limit.", tokens];
      default:
        return ["Done", tokens];
    }
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
        return via === "session_grant" ? "Approved by you for this session" : via === "user" ? "Approved once by you" : "Approved";
      case "rejected":
        return via === "cancel" ? "Rejected: the turn was stopped" : via === "proxy" ? "Rejected by the proxy" : "Rejected by you";
      case "expired":
        return via === "cancel" ? "Expired: the turn was stopped" : "Expired: nobody answered in time";
      default:
        return "";
    }
  }

  // What the agent asks to do, in the words of the App's catalog: "GitHub: Create an issue".
  function approvalWhat(a) {
    const names = (Array.isArray(a.actions) ? a.actions : []).map((action) => action && action.name).filter(Boolean);
    const app = a.app || "an App";
    return names.length ? app + ": " + names.join(", ") : (a.summary || app);
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

    const request = el("p", "approval-request");
    request.appendChild(el("span", "approval-method", a.method || ""));
    request.appendChild(document.createTextNode(" "));
    request.appendChild(el("code", "approval-url", a.url || ""));
    card.appendChild(request);
    // What a POST (or PUT, ...) would send: text only, as the server bounded it ("… (N
    // bytes in all)") and masked its secret-looking values.
    if (typeof a.body_preview === "string" && a.body_preview) {
      const body = el("details", "approval-body");
      body.open = true;
      body.appendChild(el("summary", null, "What it sends"));
      body.appendChild(scrollable(el("pre", null, a.body_preview)));
      card.appendChild(body);
    }
    const actions = Array.isArray(a.actions) ? a.actions : [];

    const entry = { card, data: a, title, countdown, closed: null, busy: false, buttons: [] };
    const buttonRow = el("div", "approval-buttons");
    buttonRow.setAttribute("role", "group");
    buttonRow.setAttribute("aria-label", "Decision");
    DECISIONS.forEach(([decision, label, className]) => {
      const button = el("button", className, label);
      button.type = "button";
      button.addEventListener("click", () => decide(entry, decision));
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
    entry.title.textContent = (state === "pending" ? "Approval needed: " : "Approval request: ") + approvalWhat(a);
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
    updateWorking();
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
      endAgentMessage();
    } else if (a.status === "pending" && entry.data.status !== "pending") {
      return; // already decided: an older state arrived late
    } else {
      entry.data = a;
    }
    updateApprovalCard(entry);
    updateApprovalAlert();
  }

  function decide(entry, decision) {
    if (entry.busy || approvalState(entry) !== "pending") return;
    entry.busy = true;
    entry.error.textContent = "";
    updateApprovalCard(entry);
    postJson("/api/v1/approvals/" + encodeURIComponent(entry.data.id) + "/decision/", { decision })
      .then(({ response, body }) => {
        entry.busy = false;
        if (response.ok && body && body.id === entry.data.id) {
          showApproval(body);
          return;
        }
        if (entry.data.status !== "pending") return; // decided meanwhile: the card says how
        entry.error.textContent = apiError(body, "Could not send your decision (HTTP " + response.status + "). Try again.");
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

  alertShow.addEventListener("click", () => {
    const first = updateApprovalAlert()[0];
    if (!first) return;
    first.card.scrollIntoView({ behavior: "smooth", block: "center" });
    first.buttons[0].focus({ preventScroll: true });
  });

  // Web apps: servers the agent started. Each is previewed in a sandboxed iframe whose
  // document stays an opaque origin; it loads Quor's /webapps/<label>/open, which hands
  // the viewer off to the app's own origin. Built from event data as text and attributes.
  const webappsBox = document.getElementById("webapps");
  const webappList = document.getElementById("webapp-list");
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
  // Its help text follows the option chosen.
  const sharingForm = document.getElementById("sharing-form");
  if (sharingForm) {
    const save = sharingForm.querySelector("button[type=submit]");
    if (save) save.hidden = true;
    const showSharingHelp = () => {
      const chosen = sharingForm.querySelector("input[name=sharing]:checked");
      document.querySelectorAll("[data-sharing-help]").forEach((help) => {
        help.hidden = !chosen || help.dataset.sharingHelp !== chosen.value;
      });
    };
    sharingForm.addEventListener("change", () => {
      showSharingHelp();
      if (sharingForm.requestSubmit) sharingForm.requestSubmit();
      else sharingForm.submit();
    });
    showSharingHelp();
  }

  // --- Status, the working indicator and the composer ---------------------------------
  const cancelForm = document.getElementById("cancel-form");
  const followUpForm = document.getElementById("follow-up");
  const followUpText = document.getElementById("text");
  const followUpButton = followUpForm.querySelector("button[type=submit]");
  const composerError = document.getElementById("composer-error");
  const composerHint = document.getElementById("composer-hint");
  let sending = false;
  // The status before Send showed the working state ahead of the stream; null once the
  // stream has said where the turn is (it alone sets the status after that).
  let statusBeforeSend = null;

  function isWorking() {
    return status === "pending" || status === "running";
  }

  // Shown from the moment a prompt is sent until the turn ends, between steps too:
  // with a real model there are seconds with nothing else to see.
  function updateWorking() {
    workingBox.hidden = !isWorking();
    if (workingBox.hidden) return;
    const waiting = [...approvals.values()].some((entry) => approvalState(entry) === "pending");
    workingText.textContent = waiting ? "Waiting for your approval…" : status === "pending" ? "Starting…" : openTool ? "Running a tool…" : liveText ? "Writing…" : "Working…";
  }

  // Cancel only while the agent works (not while a follow-up is on its way: there is
  // no turn to stop yet); follow up only when it does not.
  function showStatus(next) {
    status = next;
    statusBox.textContent = STATUS_LABELS[next] || next;
    statusBox.className = "status status-" + next;
    cancelForm.hidden = !isWorking() || sending;
    followUpButton.disabled = isWorking() || sending;
    updateWorking();
  }

  // The status as the stream (or the cancel's answer) gives it.
  function setStatus(next) {
    statusBeforeSend = null;
    showStatus(next);
  }

  function showComposerError(text) {
    composerError.textContent = text;
    composerError.hidden = !text;
  }

  // The form posts to the page without this script; with it, the API takes the message
  // and the stream brings it back, so the page stays where it is.
  function sendFollowUp() {
    const text = followUpText.value;
    if (sending) return;
    if (isWorking()) {
      showComposerError("The agent is still working. Wait until it is done, or stop it.");
      return;
    }
    if (!text.trim()) {
      showComposerError("Write a message first.");
      followUpText.focus();
      return;
    }
    // The working state at once; the stream takes over from its first event (the
    // message's own user_message), however fast the turn is and whenever the answer
    // to this request arrives. Only a refusal goes back to the status before.
    sending = true;
    statusBeforeSend = status;
    showComposerError("");
    showStatus("pending");
    postJson(api + "messages/", { text })
      .then(({ response, body }) => {
        sending = false;
        if (response.ok) {
          if (followUpText.value === text) {
            followUpText.value = "";
            followUpText.dispatchEvent(new Event("input")); // the counter (forms.js)
          }
          showStatus(status);
          return;
        }
        const busy = body && body.error && body.error.code === "sessions.busy";
        refused(busy ? "running" : null);
        showComposerError(apiError(body, "Your message was not sent (HTTP " + response.status + "). Try again."));
      })
      .catch(() => {
        sending = false;
        refused(null);
        showComposerError("Could not reach Quor, so your message was not sent. Check your connection and try again.");
      });
  }

  // A follow-up not taken: the status it replaced comes back, unless the stream said
  // something since (or the server said a turn is running: `known`).
  function refused(known) {
    if (known) setStatus(known);
    else if (statusBeforeSend !== null) setStatus(statusBeforeSend);
    else showStatus(status);
  }

  followUpForm.addEventListener("submit", (submit) => {
    submit.preventDefault();
    sendFollowUp();
  });
  // Ctrl/⌘ + Enter sends as the button does, after the browser's checks (required, the
  // length limit of forms.js).
  followUpText.addEventListener("keydown", (key) => {
    if (key.key === "Enter" && (key.ctrlKey || key.metaKey)) {
      key.preventDefault();
      if (followUpForm.requestSubmit) followUpForm.requestSubmit();
      else if (followUpForm.reportValidity()) sendFollowUp();
    }
  });
  if (/Mac|iPhone|iPad/.test(navigator.platform || navigator.userAgent)) composerHint.textContent = "⌘ + Enter to send";

  cancelForm.addEventListener("submit", (submit) => {
    submit.preventDefault();
    const button = cancelForm.querySelector("button");
    button.disabled = true;
    postJson(api + "cancel/", {})
      .then(({ response, body }) => {
        button.disabled = false;
        if (response.ok) setStatus(body && STATUS_LABELS[body.status] ? body.status : "cancelled");
        else showComposerError(apiError(body, "The agent could not be stopped (HTTP " + response.status + "). Try again."));
      })
      .catch(() => {
        button.disabled = false;
        showComposerError("Could not reach Quor to stop the agent. Check your connection and try again.");
      });
  });

  // --- The stream -----------------------------------------------------------------------
  function note(text, detail) {
    const box = el("p", "note", text);
    if (detail) box.appendChild(el("span", "note-detail", " · " + detail));
    eventsBox.appendChild(box);
  }

  function render(event) {
    const p = event.payload || {};
    const nearBottom = window.innerHeight + window.scrollY >= document.body.scrollHeight - 200;
    switch (event.kind) {
      case "user_message": {
        endAgentMessage();
        const box = el("div", "message user");
        box.appendChild(el("div", "who", "You"));
        box.appendChild(el("div", "text", p.text));
        if (p.attachments && p.attachments.length) box.appendChild(el("div", "note", "Attached: " + p.attachments.join(", ")));
        eventsBox.appendChild(box);
        setStatus("pending");
        break;
      }
      case "session_started":
        setStatus("running");
        break;
      case "assistant_text_delta":
        agentMessage().raw += p.text || "";
        if (!drawPending) {
          drawPending = true;
          requestAnimationFrame(drawLiveText);
        }
        break;
      case "assistant_text": {
        const message = agentMessage();
        message.raw = p.text || "";
        message.complete = true;
        renderMarkdown(message.lastChild, message.raw, true);
        endAgentMessage();
        announce(event, "The agent wrote: " + message.raw.slice(0, 500));
        break;
      }
      case "tool_call":
        endAgentMessage();
        showToolCall(p);
        break;
      case "tool_result":
        showToolResult(p);
        break;
      case "file_changed":
        fileChanged(p);
        break;
      case "error":
        endAgentMessage();
        announce(event, "Failed: " + showError(p));
        setStatus("failed");
        break;
      case "turn_finished": {
        endAgentMessage();
        const [text, detail] = finishedText(p);
        note(text, detail);
        announce(event, text);
        setStatus("waiting");
        break;
      }
      case "approval_requested":
      case "approval_decided":
        showApproval(p.approval);
        if (event.kind === "approval_requested") announce(event, "Approval needed: " + approvalWhat(p.approval || {}));
        break;
      case "webapp_started":
        if (p.webapp) {
          note("Web app started on port " + p.webapp.port);
          showWebApp(p.webapp, event.seq);
        }
        break;
      case "cancelled":
        endAgentMessage();
        note("Stopped by you");
        announce(event, "Stopped by you");
        setStatus("cancelled");
        break;
      default:
        break;
    }
    updateWorking();
    if (nearBottom) window.scrollTo(0, document.body.scrollHeight);
  }

  // Reconnects ask for what came after the last event seen: nothing twice, nothing lost.
  function connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const socket = new WebSocket(scheme + "://" + location.host + "/ws/sessions/" + sessionId + "/?after=" + lastSeq);
    socket.onmessage = (message) => {
      const event = JSON.parse(message.data);
      if (event.seq <= lastSeq) return;
      lastSeq = event.seq;
      render(event);
      // Other parts of the page (files, the sandbox's state) follow the same stream.
      document.dispatchEvent(new CustomEvent("quor:session-event", { detail: event }));
    };
    socket.onopen = () => { retryDelay = 1000; };
    socket.onclose = (close) => {
      if (close.code === 4401 || close.code === 4404) return;
      setTimeout(connect, retryDelay);
      retryDelay = Math.min(retryDelay * 2, 15000);
    };
  }

  setStatus(status);
  connect();
})();
