// The session page's terminal: xterm.js on the terminal WebSocket
// (sandboxes/terminal/consumers.py), and replays of the session's recordings.
//
// The socket sends what the PTY sent as binary frames, and before a close that has a
// reason, {"closed": reason} as a text frame; this sends JSON text frames,
// {"input": ...} and {"resize": [cols, rows]}. The shell lives in the sandbox, not in the
// socket: after a close that is not final (a network drop, a web process restarted) the
// page attaches again, with a growing pause, and finds the same shell. Final closes say
// why: the shell ended (4000), the terminal was opened elsewhere (4409), or it was refused.
(function () {
  "use strict";
  const panel = document.getElementById("terminal-panel");
  if (!panel || !window.Terminal) return;
  const openButton = document.getElementById("terminal-open");
  const screen = document.getElementById("terminal-screen");
  const replayScreen = document.getElementById("terminal-replay");
  const statusLine = document.getElementById("terminal-status");

  const ENDED = 4000;
  const FINAL = [ENDED, 4400, 4401, 4403, 4404, 4409, 4413];
  // Pasted text goes in pieces under the server's 64 KiB bound, even if every character
  // became a 6-byte JSON escape.
  const MAX_INPUT_CHARS = 8 * 1024;
  // What is typed while the socket (re)connects waits for it, up to this much.
  const MAX_PENDING_CHARS = 64 * 1024;
  const RETRY_MS = [500, 1000, 2000, 5000, 10000];
  const REPLAY_MAX_PAUSE_S = 2;

  let term = null;
  let fit = null;
  let socket = null;
  let retries = 0;
  let pending = [];
  let pendingChars = 0;

  function say(text) {
    statusLine.textContent = text;
  }

  function newTerminal(into) {
    const terminal = new window.Terminal({ cursorBlink: true, scrollback: 5000 });
    // The canvas renderer, loaded before open() so that the default DOM renderer, which
    // writes <style> elements the Content-Security-Policy refuses, is never made.
    terminal.loadAddon(new window.CanvasAddon.CanvasAddon());
    terminal.open(into);
    return terminal;
  }

  function open() {
    openButton.hidden = true;
    screen.hidden = false;
    if (!term) {
      fit = new window.FitAddon.FitAddon();
      term = newTerminal(screen);
      term.loadAddon(fit);
      term.onData(function (data) {
        for (let i = 0; i < data.length; i += MAX_INPUT_CHARS) {
          sendInput(data.slice(i, i + MAX_INPUT_CHARS));
        }
      });
      term.onResize(function (size) {
        send({ resize: [size.cols, size.rows] });
      });
      window.addEventListener("resize", function () {
        fit.fit();
      });
    }
    fit.fit();
    attach();
  }

  function isOpen() {
    return socket !== null && socket.readyState === WebSocket.OPEN;
  }

  function send(message) {
    if (isOpen()) socket.send(JSON.stringify(message));
  }

  // Keys typed during a reconnect are not lost: they go, in order, once the socket opens.
  function sendInput(piece) {
    if (isOpen()) {
      send({ input: piece });
    } else if (pendingChars + piece.length <= MAX_PENDING_CHARS) {
      pending.push(piece);
      pendingChars += piece.length;
    }
  }

  function takePending() {
    const pieces = pending;
    pending = [];
    pendingChars = 0;
    return pieces;
  }

  function attach() {
    const scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    const cols = term.cols;
    const rows = term.rows;
    const url =
      scheme + window.location.host + panel.dataset.socketPath +
      "?cols=" + cols + "&rows=" + rows;
    say(retries ? "Reconnecting…" : "Connecting… (a sleeping sandbox wakes up first)");
    let closedBecause = "";
    socket = new WebSocket(url);
    socket.binaryType = "arraybuffer";
    socket.onmessage = function (event) {
      if (typeof event.data === "string") {
        closedBecause = JSON.parse(event.data).closed || "";
        return;
      }
      if (retries || statusLine.textContent) {
        retries = 0;
        say("");
      }
      term.write(new Uint8Array(event.data));
    };
    socket.onopen = function () {
      term.focus();
      if (term.cols !== cols || term.rows !== rows) send({ resize: [term.cols, term.rows] });
      takePending().forEach(function (piece) {
        send({ input: piece });
      });
    };
    socket.onclose = function (event) {
      socket = null;
      if (FINAL.indexOf(event.code) === -1) {
        const pause = RETRY_MS[Math.min(retries, RETRY_MS.length - 1)];
        retries += 1;
        say("Disconnected; reconnecting…");
        window.setTimeout(attach, pause);
        return;
      }
      retries = 0;
      takePending();  // a final close: nothing will take them
      if (event.code === ENDED) {
        say("The terminal ended: " + (closedBecause || "the shell ended.") +
            " Reload the page to see its recording.");
      } else if (event.code === 4409) {
        say("The terminal was opened in another tab or window.");
      } else {
        say("The terminal was closed: " + (closedBecause || "refused (" + event.code + ")."));
      }
      openButton.textContent = "Open the terminal again";
      openButton.hidden = false;
    };
  }

  // --- replays: the asciicast v2 file, fed to a terminal with its timings ---------------

  let replayTimer = null;
  let replayTerm = null;

  function replay(url) {
    window.clearTimeout(replayTimer);
    fetch(url, { credentials: "same-origin" })
      .then(function (response) {
        if (!response.ok) throw new Error("HTTP " + response.status);
        return response.text();
      })
      .then(function (text) {
        const lines = text.split("\n").filter(Boolean);
        const header = JSON.parse(lines[0]);
        const events = lines.slice(1).map(function (line) { return JSON.parse(line); });
        if (replayTerm) replayTerm.dispose();
        replayScreen.hidden = false;
        replayTerm = newTerminal(replayScreen);
        replayTerm.resize(header.width, header.height);
        play(events, 0, 0);
      })
      .catch(function (error) {
        say("The recording could not be read: " + error.message);
      });
  }

  function play(events, index, previous) {
    if (index >= events.length) return;
    const event = events[index];
    const pause = Math.min(Math.max(event[0] - previous, 0), REPLAY_MAX_PAUSE_S);
    replayTimer = window.setTimeout(function () {
      if (event[1] === "o") {
        replayTerm.write(event[2]);
      } else if (event[1] === "r") {
        const size = event[2].split("x");
        replayTerm.resize(Number(size[0]), Number(size[1]));
      }
      play(events, index + 1, event[0]);
    }, pause * 1000);
  }

  openButton.addEventListener("click", open);
  panel.querySelectorAll(".terminal-replay").forEach(function (button) {
    button.addEventListener("click", function () {
      replay(button.dataset.castUrl);
    });
  });
})();
