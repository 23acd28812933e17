// The session page: the live event stream over WebSocket, and the file browser.
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
      .then((r) => (r.ok ? r.json() : []))
      .then((entries) => {
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
