#!/usr/bin/env python3
"""Quor's agent runtime: plays one user turn of a coding agent inside the sandbox.

Usage: python3 /opt/quor/agent.py --session-id ID --session-dir DIR

It reads the new user message from DIR/.quor/next-message.txt (and deletes it; no file,
nothing to do: exit 0), adds it to the conversation in DIR/.quor/conversation.json, then
loops: call the model with the tools (streaming), run the tools it asks for in DIR, give it
the results, until it answers without a tool call or QUOR_MAX_STEPS model calls were made.
Everything it does is posted to Quor as events. The conversation is saved after every
step, so the next run (a follow-up message, or a restart) continues it.

Web apps (the start_web_app tool) are servers started in their own session and process
group: they outlive the turn (a timeout or SIGTERM stops the turn, not them) and Quor
shows them to the user once the runtime has registered them.

Exit status: 0 turn finished (or nothing to do); 2 an `error` event was posted (model
provider failure, bad configuration, internal failure); 3 Quor's API stayed unreachable;
143 stopped by SIGTERM (a running command's process group is killed first).

Why plain HTTP instead of the providers' SDKs: this file runs with the standard library
only (the image carries no SDKs, and nothing the user pip-installs may change Quor's own
program); the streaming formats are server-sent events, a few lines to parse; and every
request must go through the egress proxy, which urllib does from HTTP(S)_PROXY (with the
proxy credentials in the URL), with the CA bundle of SSL_CERT_FILE. NO_PROXY is ignored
here: nothing the runtime calls is local to the sandbox, and a model or Quor address on
the host's loopback (development) must still go through the proxy.
"""

import argparse
import contextlib
import ipaddress
import json
import os
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.parse
import urllib.request
import uuid
from http.client import HTTPException
from pathlib import Path

from quor_search import SearchFailed, format_results, proxy_opener, search

EXIT_ERROR_EVENT = 2
EXIT_QUOR_UNREACHABLE = 3
EXIT_TERMINATED = 143

FLUSH_INTERVAL = 0.1  # seconds a text delta may wait before it is posted
EVENT_POST_TIMEOUT = 10
EVENT_RETRY_DELAYS = (0.2, 0.5, 1.0, 2.0)  # then Quor counts as unreachable
OUTPUT_GRACE = 0.2  # seconds to keep reading output after a command has ended
EXIT_LINE_ROOM = 64  # bytes kept free for run_command's "[exit code: N]" line
WEBAPP_START_TIMEOUT = 20  # seconds a web app has to listen on its port
WEBAPP_LOOPBACK_GRACE = 2  # seconds a loopback-only listener gets to also bind 0.0.0.0
WEBAPP_MAX_COMMAND = 2000  # characters (as Quor accepts)
WEBAPP_LOG_TAIL = 3000  # bytes of the log shown when a web app does not start

SYSTEM_PROMPT = """\
You are a coding agent working in a Linux sandbox, in the directory {directory}.
Use the tools to look at and change files and to run commands there. Give paths \
relative to that directory. When the task is done, answer with a short summary of \
what you did and found, without calling a tool."""


# --- configuration ---------------------------------------------------------------------

API_KEY_VARIABLES = {
    "anthropic": "ANTHROPIC_API_KEY",
    "openai": "OPENAI_API_KEY",
    "openrouter": "OPENROUTER_API_KEY",
}


class Config:
    def __init__(self, env):
        self.problems = []
        self.api_url = env.get("QUOR_API_URL", "").rstrip("/")
        self.api_token = env.get("QUOR_API_TOKEN", "")
        self.model_kind = env.get("QUOR_MODEL_KIND", "")
        self.model_base_url = env.get("QUOR_MODEL_BASE_URL", "").rstrip("/")
        self.model_name = env.get("QUOR_MODEL_NAME", "")
        self.api_key = env.get(API_KEY_VARIABLES.get(self.model_kind, ""), "")
        self.max_steps = self._int(env, "QUOR_MAX_STEPS", 30, minimum=1)
        self.command_timeout = self._int(env, "QUOR_COMMAND_TIMEOUT", 120, minimum=1)
        self.output_limit = self._int(env, "QUOR_OUTPUT_LIMIT", 16384, minimum=256)
        self.model_timeout = self._int(env, "QUOR_MODEL_TIMEOUT", 300, minimum=1)
        self.max_tokens = self._int(env, "QUOR_MAX_TOKENS", 4096, minimum=1)
        self.heartbeat_interval = self._int(env, "QUOR_HEARTBEAT_INTERVAL", 15, minimum=1)
        if self.model_kind not in API_KEY_VARIABLES:
            self.problems.append(
                f"QUOR_MODEL_KIND must be one of {', '.join(API_KEY_VARIABLES)}, "
                f"not {self.model_kind!r}."
            )
        if not self.model_name:
            self.problems.append("QUOR_MODEL_NAME is not set.")
        if urllib.parse.urlsplit(self.model_base_url).scheme not in ("http", "https"):
            self.problems.append("QUOR_MODEL_BASE_URL must be an http(s) URL.")
        # Values that must never appear in a message: credentials and their placeholders.
        self.secrets = [self.api_token, *(env.get(v, "") for v in API_KEY_VARIABLES.values())]
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
            password = urllib.parse.urlsplit(env.get(name, "")).password
            self.secrets.append(password or "")

    def _int(self, env, name, default, *, minimum):
        try:
            return max(minimum, int(env.get(name) or default))
        except ValueError:
            self.problems.append(f"{name} must be a whole number.")
            return default


def post_json(url, body, headers, timeout):
    """The response to a JSON POST, through the egress proxy."""
    headers = {"Content-Type": "application/json", **headers}
    data = json.dumps(body).encode()
    # The URLs come from QUOR_API_URL and QUOR_MODEL_BASE_URL, checked to be http(s).
    request = urllib.request.Request(url, data=data, headers=headers, method="POST")  # noqa: S310
    return proxy_opener().open(request, timeout=timeout)


def scrub(text, secrets, limit=500):
    """`text` without credentials, bounded: safe to show the user."""
    for secret in secrets:
        if len(secret) >= 4:
            text = text.replace(secret, "[redacted]")
    text = re.sub(r"\b(?:sk|pk|rk)-[\w.*-]{4,}", "[redacted]", text)
    text = re.sub(r"(?i)\bbearer\s+\S+", "Bearer [redacted]", text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --- events to Quor -------------------------------------------------------------------


class QuorUnreachable(Exception):
    pass


class Events:
    """Posts events to Quor's API. Text deltas wait in a buffer (at most FLUSH_INTERVAL,
    and never past another event), so a fast stream is not one request per token."""

    def __init__(self, config, session_id, turn=None):
        session = urllib.parse.quote(session_id, safe="")
        self.turn = turn  # sent with every post: Quor refuses posts of a turn that ended
        self.url = f"{config.api_url}/api/v1/runtime/sessions/{session}/events/"
        self.heartbeat_url = f"{config.api_url}/api/v1/runtime/sessions/{session}/heartbeat/"
        self.token = config.api_token
        self.last_posted = None  # the first heartbeat goes at once
        self._text = ""  # delta text not posted yet
        self._since = 0.0
        self._buffer_lock = threading.Lock()  # guards _text and _since
        self._send_lock = threading.Lock()  # keeps posts in order
        self._failure = None
        threading.Thread(target=self._flush_periodically, daemon=True).start()

    def delta(self, text):
        self._raise_failure()
        with self._buffer_lock:
            if not self._text:
                self._since = time.monotonic()
            self._text += text

    def emit(self, kind, payload):
        self._raise_failure()
        self._send([{"kind": kind, "payload": payload}])

    def flush(self):
        self._raise_failure()
        self._send([])

    def _send(self, events):
        with self._send_lock:
            with self._buffer_lock:
                text, self._text = self._text, ""
            if text:
                events = [{"kind": "assistant_text_delta", "payload": {"text": text}}, *events]
            if events:
                self._post(events)

    def _flush_periodically(self):
        while True:
            time.sleep(FLUSH_INTERVAL / 4)
            with self._buffer_lock:
                due = self._text and time.monotonic() - self._since >= FLUSH_INTERVAL
            if due:
                try:
                    self._send([])
                except QuorUnreachable as exc:
                    self._failure = exc
                    return

    def start_heartbeat(self, interval):
        threading.Thread(target=self._beat, args=(interval,), daemon=True).start()

    def _beat(self, interval):
        """Tells Quor the turn is still being worked on whenever nothing else was posted
        for `interval` seconds (a long command, a model that thinks, an approval): a turn
        whose agent falls silent counts as lost. A 409 says the turn was ended without
        this agent (cancelled, or found lost): it stops."""
        headers = {"Authorization": f"Bearer {self.token}"}
        while True:
            if self.last_posted is not None:
                time.sleep(max(0.0, self.last_posted + interval - time.monotonic()))
                if time.monotonic() - self.last_posted < interval:
                    continue
            try:
                body = {"turn": self.turn} if self.turn else {}
                with post_json(self.heartbeat_url, body, headers, EVENT_POST_TIMEOUT) as response:
                    response.read()
            except urllib.error.HTTPError as exc:
                if exc.code == 409:
                    on_sigterm(signal.SIGTERM, None)
            except (OSError, HTTPException):
                pass  # Quor is out of reach for now: tried again after `interval`
            self.last_posted = time.monotonic()

    def _raise_failure(self):
        if self._failure:
            raise self._failure

    def _post(self, events):
        headers = {"Authorization": f"Bearer {self.token}"}
        problem = ""
        for delay in (*EVENT_RETRY_DELAYS, None):
            try:
                body = {"events": events, **({"turn": self.turn} if self.turn else {})}
                with post_json(self.url, body, headers, EVENT_POST_TIMEOUT) as response:
                    response.read()
                self.last_posted = time.monotonic()
                return
            except urllib.error.HTTPError as exc:
                problem = f"HTTP {exc.code}"
                # 401: the proxy may not know a just re-minted sandbox credential yet
                # (it refreshes every 2 s); 408 and 429 are worth another try too.
                if 400 <= exc.code < 500 and exc.code not in (401, 408, 429):
                    break  # asking again will not help
            except (OSError, HTTPException) as exc:
                problem = str(exc) or type(exc).__name__
            if delay is None:
                break
            time.sleep(delay)
        raise QuorUnreachable(f"Could not post events to Quor: {problem}")


# --- tools ----------------------------------------------------------------------------


class ToolResult:
    def __init__(self, output, *, is_error=False, changed=()):
        self.output = output
        self.is_error = is_error
        self.changed = list(changed)  # absolute paths of files the tool changed


class ToolError(Exception):
    """A tool could not do what was asked; the message goes back to the model."""


class Context:
    def __init__(self, directory, config, session_id=""):
        self.directory = directory
        self.config = config
        self.session_id = session_id

    def path(self, value):
        if not value:
            raise ToolError("The path is empty.")
        return Path(os.path.normpath(self.directory / value))  # an absolute value wins


def clip(data, limit, omitted=0):
    """The text of `data` in at most `limit` UTF-8 bytes: all of it, or its start and its
    end around a "[truncated]" marker. `omitted` counts bytes already left out of the
    middle of `data`."""
    text = data.decode("utf-8", "replace")
    encoded = text.encode()
    if not omitted and len(encoded) <= limit:
        return text
    marker = f"\n[truncated] ({len(data) + omitted} bytes in all)\n"
    keep = max(0, limit - len(marker.encode()))
    end = encoded[len(encoded) - keep // 2 :] if keep // 2 else b""
    start = encoded[: keep - len(end)]
    return start.decode("utf-8", "ignore") + marker + end.decode("utf-8", "ignore")


class Capture:
    """The first and the last `limit` bytes of an output, and its total size."""

    def __init__(self, limit):
        self.limit = limit
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, data):
        self.total += len(data)
        room = self.limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            del self.tail[: -self.limit]

    def text(self, limit):
        data = bytes(self.head + self.tail)
        return clip(data, limit, self.total - len(data))


_running_groups = set()  # process groups of running commands, killed on SIGTERM
_starting = False  # a command is being started: a SIGTERM waits until its group is known
_sigterm_pending = False


def kill_group(pgid):
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def start_in_group(ctx, command, stdout):
    """`command` in bash, in a process group of its own that SIGTERM kills. A SIGTERM that
    comes while it starts is handled once its group is known: between the start and the
    group's record, the command would otherwise outlive the turn it was cancelled with."""
    global _starting
    _starting = True
    try:
        process = subprocess.Popen(  # noqa: S603  (running the model's commands is the point)
            ["bash", "-lc", command],  # noqa: S607  (the image's bash, found on PATH)
            cwd=ctx.directory,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, killed as a whole
        )
        _running_groups.add(process.pid)
    finally:
        _starting = False
        if _sigterm_pending:
            on_sigterm(signal.SIGTERM, None)
    return process


def run_command(ctx, args):
    limit = ctx.config.output_limit - EXIT_LINE_ROOM
    timeout = min(args.get("timeout") or ctx.config.command_timeout, ctx.config.command_timeout)
    timeout = max(1, timeout)
    process = start_in_group(ctx, args["command"], subprocess.PIPE)
    output = Capture(limit)
    deadline = time.monotonic() + timeout
    stop_reading_at = None  # set once the command ended: then read what is left, briefly
    timed_out = False
    fd = process.stdout.fileno()
    try:
        while True:
            now = time.monotonic()
            if stop_reading_at is None:
                if process.poll() is not None:
                    stop_reading_at = now + OUTPUT_GRACE
                elif now >= deadline:
                    timed_out = True
                    kill_group(process.pid)
                    process.wait()
                    stop_reading_at = now + OUTPUT_GRACE
            elif now >= stop_reading_at:
                break  # processes it left in the background still hold the output
            wait = (stop_reading_at or deadline) - now
            if select.select([fd], [], [], max(0.0, min(wait, 0.1)))[0]:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                output.add(chunk)
    finally:
        process.stdout.close()
        _running_groups.discard(process.pid)
    code = process.wait()
    text = output.text(limit)
    if text and not text.endswith("\n"):
        text += "\n"
    if timed_out:
        return ToolResult(
            text + f"[timed out after {timeout} seconds: the command was killed]", is_error=True
        )
    return ToolResult(text + f"[exit code: {code}]", is_error=code != 0)


def read_file(ctx, args):
    path = ctx.path(args["path"])
    limit = ctx.config.output_limit
    try:
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            head = file.read(limit)
            tail = b""
            if size > 2 * limit:
                file.seek(size - limit)
                tail = file.read(limit)
            elif size > limit:
                tail = file.read()
    except IsADirectoryError:
        raise ToolError(f"{args['path']} is a directory; use list_files.") from None
    except FileNotFoundError:
        raise ToolError(f"{args['path']} does not exist.") from None
    data = head + tail
    return ToolResult(clip(data, limit, max(0, size - len(data))))


def write_file(ctx, args):
    path = ctx.path(args["path"])
    path.parent.mkdir(parents=True, exist_ok=True)
    data = args["content"].encode()
    path.write_bytes(data)
    return ToolResult(f"Wrote {len(data)} bytes to {args['path']}.", changed=[path])


def edit_file(ctx, args):
    path = ctx.path(args["path"])
    old, new = args["old"], args["new"]
    if not old:
        raise ToolError("`old` is empty: give the exact text to replace.")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ToolError(f"{args['path']} does not exist.") from None
    except UnicodeDecodeError:
        raise ToolError(f"{args['path']} is not UTF-8 text.") from None
    count = text.count(old)
    if count == 0:
        raise ToolError(f"`old` does not occur in {args['path']}: nothing was changed.")
    if count > 1:
        raise ToolError(
            f"`old` occurs {count} times in {args['path']}: nothing was changed. "
            "Include more of the surrounding text so that it occurs exactly once."
        )
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    return ToolResult(f"Edited {args['path']}.", changed=[path])


def list_files(ctx, args):
    path = ctx.path(args.get("path") or ".")
    try:
        entries = sorted(os.scandir(path), key=lambda entry: entry.name)
    except FileNotFoundError:
        raise ToolError(f"{args.get('path')} does not exist.") from None
    except NotADirectoryError:
        raise ToolError(f"{args.get('path')} is a file, not a directory.") from None
    names = [entry.name + ("/" if entry.is_dir() else "") for entry in entries]
    return ToolResult("\n".join(names) if names else "(empty directory)")


# --- web apps ---------------------------------------------------------------------------

# /proc/net/tcp* state of a listening socket.
TCP_LISTEN = "0A"


def _proc_address(hex_address):
    """An address of /proc/net/tcp or tcp6: 32-bit words, each printed in host order."""
    words = [int(hex_address[i : i + 8], 16) for i in range(0, len(hex_address), 8)]
    return ipaddress.ip_address(b"".join(struct.pack("=I", word) for word in words))


def listeners(port):
    """What listens on TCP `port` in this network namespace: a set of "any" (0.0.0.0 or
    ::), "loopback" (127.x, ::1) and "address" (another address of this machine). None
    when /proc/net/tcp cannot be read."""
    found, readable = set(), False
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name, encoding="ascii") as table:
                lines = table.readlines()[1:]
        except OSError:
            continue
        readable = True
        for line in lines:
            fields = line.split()
            if len(fields) < 4 or fields[3] != TCP_LISTEN:
                continue
            hex_address, _, hex_port = fields[1].partition(":")
            if int(hex_port, 16) != port:
                continue
            address = _proc_address(hex_address)
            mapped = getattr(address, "ipv4_mapped", None) or address
            if address.is_unspecified:
                found.add("any")
            elif mapped.is_loopback:
                found.add("loopback")
            else:
                found.add("address")
    return found if readable else None


def _reachable(port):
    """Without /proc: whether the port answers on this machine's own (non-loopback)
    address, which is where Quor connects."""
    try:
        address = socket.gethostbyname(socket.gethostname())
    except OSError:
        return set()
    if ipaddress.ip_address(address).is_loopback:
        return set()
    with contextlib.suppress(OSError), socket.create_connection((address, port), timeout=1):
        return {"address"}
    return set()


def _listening(port):
    found = listeners(port)
    return _reachable(port) if found is None else found


def _log_tail(path):
    try:
        with open(path, "rb") as log:
            size = os.fstat(log.fileno()).st_size
            log.seek(max(0, size - WEBAPP_LOG_TAIL))
            data = log.read()
    except OSError:
        return "(no log)"
    text = data.decode("utf-8", "replace").strip()
    if not text:
        return "(the log is empty)"
    return ("[…]\n" if size > WEBAPP_LOG_TAIL else "") + text


def _register_web_app(ctx, port, command):
    """Tells Quor (which shows the app to the user); the proxy adds the credential."""
    session = urllib.parse.quote(ctx.session_id, safe="")
    url = f"{ctx.config.api_url}/api/v1/runtime/sessions/{session}/webapps/"
    headers = {"Authorization": f"Bearer {ctx.config.api_token}"}
    problem = ""
    for delay in (*EVENT_RETRY_DELAYS, None):
        try:
            with post_json(
                url, {"port": port, "command": command}, headers, EVENT_POST_TIMEOUT
            ) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            message = _provider_message(exc.read(65536))
            problem = f"Quor refused it (HTTP {exc.code})" + (f": {message}" if message else ".")
            if 400 <= exc.code < 500 and exc.code not in (401, 408, 429):
                break  # asking again will not help
        except (OSError, HTTPException, ValueError) as exc:
            problem = f"Quor could not be reached: {exc or type(exc).__name__}"
        if delay is None:
            break
        time.sleep(delay)
    raise ToolError(f"The web app started but could not be registered. {problem}")


def start_web_app(ctx, args):
    port, command = args["port"], args["command"]
    if not 1024 <= port <= 65535:
        raise ToolError("`port` must be from 1024 to 65535.")
    if not command.strip() or len(command) > WEBAPP_MAX_COMMAND:
        raise ToolError(f"`command` must be 1 to {WEBAPP_MAX_COMMAND} characters.")
    if _listening(port):
        raise ToolError(
            f"Port {port} is already in use. If it is an earlier server, stop it first "
            "(kill its processes), or use another port."
        )
    log_name = f".quor/webapp-{port}.log"
    log_path = ctx.directory / log_name
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        # Outlives the turn once it is registered; until then, SIGTERM (cancel) stops it too.
        process = start_in_group(ctx, command, log)
    try:
        return _wait_and_register(ctx, process, port, command, log_name)
    finally:
        _running_groups.discard(process.pid)


def _wait_and_register(ctx, process, port, command, log_name):
    log_path = ctx.directory / log_name
    deadline = time.monotonic() + WEBAPP_START_TIMEOUT
    loopback_since = None
    problem = None
    while problem is None:
        found = _listening(port)
        if found & {"any", "address"}:
            break
        now = time.monotonic()
        code = process.poll()
        if "loopback" in found:
            loopback_since = loopback_since or now
            if now - loopback_since >= WEBAPP_LOOPBACK_GRACE:
                problem = (
                    f"The server listens on port {port} of 127.0.0.1 (loopback) only, where "
                    "Quor cannot reach it: make it listen on 0.0.0.0 (e.g. `--host 0.0.0.0` "
                    "or `--bind 0.0.0.0`)."
                )
        elif code not in (None, 0):
            problem = f"The command exited with code {code} before port {port} was listening."
        elif now >= deadline:
            problem = (
                f"Nothing listened on port {port} of 0.0.0.0 within {WEBAPP_START_TIMEOUT} "
                "seconds. The server must listen on 0.0.0.0 (not 127.0.0.1) on the port given."
            )
        if problem is None:
            time.sleep(0.2)
    if problem is not None:
        kill_group(process.pid)
        process.wait()
        tail = _log_tail(log_path)
        raise ToolError(f"{problem} The server was stopped. End of {log_name}:\n{tail}")
    try:
        webapp = _register_web_app(ctx, port, command)
    except ToolError:
        kill_group(process.pid)
        process.wait()
        raise
    url = webapp.get("url") if isinstance(webapp, dict) else None
    return ToolResult(
        f"The web app is running on port {port} and the user sees a preview of it in the "
        f"session page. Its address: {url or '(not given)'}\n"
        f"It keeps running after this turn (process group {process.pid}; output in {log_name}). "
        f"To restart it: `kill -- -{process.pid}`, then call start_web_app again."
    )


def search_company_knowledge(ctx, args):
    """Quor searches as the sandbox's owner: only documents the user may read."""
    limit = args.get("limit", 8)
    if not 1 <= limit <= 20:
        raise ToolError("`limit` must be from 1 to 20.")
    try:
        results = search(ctx.config.api_url, ctx.config.api_token, args["query"], limit=limit)
    except SearchFailed as exc:
        raise ToolError(str(exc)) from None
    return ToolResult(format_results(results))


def _schema(required, **properties):
    return {"type": "object", "properties": properties, "required": required}


_STRING, _INTEGER = {"type": "string"}, {"type": "integer"}
_PATH = {"type": "string", "description": "Relative to the working directory (preferred)."}

# The tools the model may call: name -> description, JSON schema of the input, function.
TOOLS = {
    "run_command": {
        "description": "Run a shell command (bash -lc) in the working directory. Returns its "
        "combined stdout and stderr (start and end kept if long) and its exit code. It is "
        "killed after `timeout` seconds.",
        "schema": _schema(
            ["command"], command=_STRING, timeout={**_INTEGER, "description": "Seconds."}
        ),
        "function": run_command,
    },
    "read_file": {
        "description": "Read a text file (start and end kept if long).",
        "schema": _schema(["path"], path=_PATH),
        "function": read_file,
    },
    "write_file": {
        "description": "Create or overwrite a file with the given content; creates missing "
        "parent directories.",
        "schema": _schema(["path", "content"], path=_PATH, content=_STRING),
        "function": write_file,
    },
    "edit_file": {
        "description": "Replace the text `old` with `new` in a file. `old` must occur exactly "
        "once: include enough surrounding text.",
        "schema": _schema(["path", "old", "new"], path=_PATH, old=_STRING, new=_STRING),
        "function": edit_file,
    },
    "list_files": {
        "description": "List a directory (default: the working directory); directory names "
        "end with /.",
        "schema": _schema([], path=_PATH),
        "function": list_files,
    },
    "search_company_knowledge": {
        "description": "Search the company's documents (policies, handbooks, wikis, reports) "
        "that the user may read. Returns the best documents' titles, links and matching "
        'passages. Query syntax: words, "a phrase", `or`, `-word` to leave a word out. '
        "Scripts in the sandbox can run the same search with the `quor-search` command.",
        "schema": _schema(
            ["query"],
            query=_STRING,
            limit={**_INTEGER, "description": "How many documents (1-20, default 8)."},
        ),
        "function": search_company_knowledge,
    },
    "start_web_app": {
        "description": "Start a web server that the user can see and use (a preview in the "
        "session page, and a link): `command` runs in the background in the working directory "
        "and must serve HTTP on `port`, listening on 0.0.0.0 (not 127.0.0.1 or localhost, "
        "which Quor cannot reach), e.g. `python3 -m http.server --bind 0.0.0.0 8000`. Waits "
        f"up to {WEBAPP_START_TIMEOUT} seconds for the port, then returns the app's address. "
        "The server keeps running after your turn; its output goes to .quor/webapp-<port>.log.",
        "schema": _schema(
            ["command", "port"],
            command={**_STRING, "description": "Shell command (bash -lc) that starts the server."},
            port={**_INTEGER, "description": "The port it listens on (1024-65535)."},
        ),
        "function": start_web_app,
    },
}

_JSON_TYPES = {"string": str, "integer": int, "object": dict, "boolean": bool}


def check_input(schema, args):
    if not isinstance(args, dict):
        raise ToolError("The tool input must be a JSON object.")
    for name in schema.get("required", []):
        if name not in args:
            raise ToolError(f"Missing input {name!r}.")
    for name, value in args.items():
        expected = _JSON_TYPES.get(schema["properties"].get(name, {}).get("type"))
        if expected is None:
            continue
        if not isinstance(value, expected) or (isinstance(value, bool) and expected is not bool):
            raise ToolError(f"Input {name!r} must be of type {expected.__name__}.")


def execute(ctx, call):
    tool = TOOLS.get(call["name"])
    try:
        if tool is None:
            raise ToolError(f"There is no tool named {call['name']!r}.")
        if "invalid_input" in call:
            raise ToolError("The tool input was not valid JSON.")
        check_input(tool["schema"], call["input"])
        result = tool["function"](ctx, call["input"])
    except ToolError as exc:
        result = ToolResult(f"Error: {exc}", is_error=True)
    except OSError as exc:
        result = ToolResult(f"Error: {exc.strerror or exc}", is_error=True)
    result.output = clip(result.output.encode(), ctx.config.output_limit)
    return result


# --- model providers ------------------------------------------------------------------


class ModelError(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


class ModelRequestRejected(Exception):
    """The user rejected the model request where the egress proxy parked it for their
    approval (an App whose addresses cover the model provider's): the user's choice,
    not a failure, so the turn ends there."""


# The namespaces of the codes in the egress proxy's refusals (egress/decisions.py):
# a model request it did not send. A provider's own error codes are never in them.
PROXY_CODE_PREFIXES = ("approvals.", "apps.", "egress.")


def _proxy_refusal(body):
    """(code, message) of the egress proxy's refusal in an error body, `{"error":
    {"code": "approvals.rejected", "message": ...}}`; None for any other body."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return None
    code = error.get("code") if isinstance(error, dict) else None
    if not isinstance(code, str) or not code.startswith(PROXY_CODE_PREFIXES):
        return None
    return code, str(error.get("message") or "")


class Reply:
    def __init__(self):
        self.text = ""
        self.tool_calls = []  # {"id", "name", "input"} (+ "invalid_input" if not JSON)
        self.stop_reason = None
        self.input_tokens = 0
        self.output_tokens = 0


def sse_events(response):
    """(event, data) pairs of a server-sent event stream."""
    event, data = None, []
    for raw in response:
        line = raw.decode("utf-8").rstrip("\r\n")
        if not line:
            if data:
                yield event, "\n".join(data)
            event, data = None, []
        elif not line.startswith(":"):  # a comment (keep-alive) otherwise
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "event":
                event = value
            elif field == "data":
                data.append(value)
    if data:
        yield event, "\n".join(data)


def _provider_message(body):
    """The provider's own error message in an error body, if there is one."""
    try:
        parsed = json.loads(body)
    except ValueError:
        text = body.decode("utf-8", "replace").strip()
        return "" if text.startswith("<") else text[:300]
    error = parsed.get("error", parsed) if isinstance(parsed, dict) else parsed
    if isinstance(error, dict):
        return str(error.get("message") or "")
    return str(error) if isinstance(error, str) else ""


def _status_error(status, message):
    if status in (401, 403):
        code, what = "model.unauthorized", "refused the credentials"
    elif status == 429:
        code, what = "model.rate_limited", "is rate limiting"
    elif status >= 500:
        code, what = "model.unavailable", "is unavailable"
    else:
        code, what = "model.bad_request", "refused the request"
    detail = f": {message}" if message else "."
    return ModelError(code, f"The model provider {what} (HTTP {status}){detail}")


def _stream_error(error):
    """A ModelError for an error sent in the middle of a stream."""
    error = error if isinstance(error, dict) else {"message": str(error)}
    kind, message = str(error.get("type") or error.get("code") or ""), error.get("message")
    status = {
        "authentication_error": 401,
        "permission_error": 403,
        "rate_limit_error": 429,
        "overloaded_error": 529,
        "api_error": 500,
    }.get(kind)
    if status is None and str(error.get("code", "")).isdigit():
        status = int(error["code"])
    return _status_error(status or 500, str(message or kind))


class Model:
    """Streams one model reply: `complete(system, messages, on_text)` -> Reply."""

    def __init__(self, config):
        self.config = config

    def complete(self, system, messages, on_text):
        url, headers, body = self.request(system, messages)
        headers = {"Accept": "text/event-stream", **headers}
        silence = self.config.model_timeout
        try:
            with post_json(url, body, headers, silence) as response:
                reply = self.parse(sse_events(response), on_text)
        except urllib.error.HTTPError as exc:
            body = exc.read(65536)
            refusal = _proxy_refusal(body)
            if refusal is None:
                raise _status_error(exc.code, _provider_message(body)) from None
            # The proxy did not send the request, for its own reason (an approval that
            # expired, an App or network rule): the provider never saw Quor's
            # credentials, so no model.* code; the proxy's code tells the user why.
            code, message = refusal
            if code == "approvals.rejected":
                raise ModelRequestRejected() from None
            raise ModelError(
                code,
                f"Quor's egress proxy did not send the model request (HTTP {exc.code}): {message}",
            ) from None
        except TimeoutError:
            raise ModelError(
                "model.timeout", f"The model provider sent nothing for {silence} seconds."
            ) from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                raise ModelError(
                    "model.timeout", f"The model provider did not answer within {silence} seconds."
                ) from None
            raise ModelError(
                "model.unavailable", f"Could not reach the model provider: {exc.reason}."
            ) from None
        except (OSError, HTTPException) as exc:
            raise ModelError(
                "model.unavailable", f"The connection to the model provider broke: {exc}."
            ) from None
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ModelError(
                "model.bad_response", f"The model provider's answer could not be read: {exc}."
            ) from None
        return reply

    @staticmethod
    def _call(call_id, name, arguments):
        call = {"id": call_id or f"call_{uuid.uuid4().hex[:24]}", "name": name, "input": {}}
        try:
            call["input"] = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            call["invalid_input"] = arguments
        return call


class AnthropicModel(Model):
    """The Anthropic Messages API."""

    STOP_REASONS = {"end_turn": "end_turn", "stop_sequence": "end_turn", "tool_use": "tool_use"}

    def request(self, system, messages):
        body = {
            "model": self.config.model_name,
            "max_tokens": self.config.max_tokens,
            "system": system,
            "messages": self.messages(messages),
            "tools": [
                {"name": name, "description": tool["description"], "input_schema": tool["schema"]}
                for name, tool in TOOLS.items()
            ],
            "stream": True,
        }
        headers = {"x-api-key": self.config.api_key, "anthropic-version": "2023-06-01"}
        return f"{self.config.model_base_url}/v1/messages", headers, body

    @staticmethod
    def messages(messages):
        result = []
        for message in messages:
            if message["role"] == "user":
                role, blocks = "user", [{"type": "text", "text": message["text"]}]
            elif message["role"] == "assistant":
                role = "assistant"
                blocks = [{"type": "text", "text": message["text"]}] if message["text"] else []
                blocks += [
                    {"type": "tool_use", "id": c["id"], "name": c["name"], "input": c["input"]}
                    for c in message["tool_calls"]
                ]
            else:
                role, blocks = (
                    "user",
                    [
                        {
                            "type": "tool_result",
                            "tool_use_id": r["id"],
                            "content": r["output"],
                            "is_error": r["is_error"],
                        }
                        for r in message["results"]
                    ],
                )
            if not blocks:
                continue
            if result and result[-1]["role"] == role:  # the API wants roles to alternate
                result[-1]["content"].extend(blocks)
            else:
                result.append({"role": role, "content": blocks})
        return result

    def parse(self, events, on_text):
        reply, blocks, finished = Reply(), {}, False
        for _, data in events:
            event = json.loads(data)
            kind = event.get("type")
            if kind == "message_start":
                usage = event["message"].get("usage") or {}
                reply.input_tokens = sum(
                    usage.get(name) or 0
                    for name in (
                        "input_tokens",
                        "cache_creation_input_tokens",
                        "cache_read_input_tokens",
                    )
                )
                reply.output_tokens = usage.get("output_tokens") or 0
            elif kind == "content_block_start":
                block = event["content_block"]
                if block["type"] == "tool_use":
                    blocks[event["index"]] = {"id": block["id"], "name": block["name"], "json": []}
                elif block.get("text"):
                    reply.text += block["text"]
                    on_text(block["text"])
            elif kind == "content_block_delta":
                delta = event["delta"]
                if delta["type"] == "text_delta":
                    reply.text += delta["text"]
                    on_text(delta["text"])
                elif delta["type"] == "input_json_delta":
                    blocks[event["index"]]["json"].append(delta["partial_json"])
            elif kind == "message_delta":
                reply.stop_reason = event["delta"].get("stop_reason") or reply.stop_reason
                usage = event.get("usage") or {}
                reply.output_tokens = usage.get("output_tokens") or reply.output_tokens
            elif kind == "message_stop":
                finished = True
                break
            elif kind == "error":
                raise _stream_error(event.get("error"))
        if not finished:
            raise ModelError("model.bad_response", "The model provider's answer ended early.")
        reply.tool_calls = [
            self._call(b["id"], b["name"], "".join(b["json"])) for _, b in sorted(blocks.items())
        ]
        reply.stop_reason = self.STOP_REASONS.get(reply.stop_reason, reply.stop_reason)
        return reply


class OpenAIModel(Model):
    """OpenAI Chat Completions (also OpenRouter's API)."""

    STOP_REASONS = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}

    def request(self, system, messages):
        # OpenAI's newer models refuse max_tokens; OpenRouter documents max_tokens only.
        tokens = "max_completion_tokens" if self.config.model_kind == "openai" else "max_tokens"
        body = {
            "model": self.config.model_name,
            tokens: self.config.max_tokens,
            "messages": self.messages(system, messages),
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": name,
                        "description": tool["description"],
                        "parameters": tool["schema"],
                    },
                }
                for name, tool in TOOLS.items()
            ],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        headers = {"Authorization": f"Bearer {self.config.api_key}"}
        return f"{self.config.model_base_url}/chat/completions", headers, body

    @staticmethod
    def messages(system, messages):
        result = [{"role": "system", "content": system}]
        for message in messages:
            if message["role"] == "user":
                result.append({"role": "user", "content": message["text"]})
            elif message["role"] == "assistant":
                if not message["text"] and not message["tool_calls"]:
                    continue
                entry = {"role": "assistant", "content": message["text"] or None}
                if message["tool_calls"]:
                    entry["tool_calls"] = [
                        {
                            "id": c["id"],
                            "type": "function",
                            "function": {"name": c["name"], "arguments": json.dumps(c["input"])},
                        }
                        for c in message["tool_calls"]
                    ]
                result.append(entry)
            else:
                result += [
                    {"role": "tool", "tool_call_id": r["id"], "content": r["output"]}
                    for r in message["results"]
                ]
        return result

    def parse(self, events, on_text):
        reply, calls, finished = Reply(), {}, False
        for _, data in events:
            if data.strip() == "[DONE]":
                finished = True
                break
            chunk = json.loads(data)
            if chunk.get("error"):
                raise _stream_error(chunk["error"])
            if chunk.get("usage"):
                reply.input_tokens = chunk["usage"].get("prompt_tokens") or 0
                reply.output_tokens = chunk["usage"].get("completion_tokens") or 0
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                if delta.get("content"):
                    reply.text += delta["content"]
                    on_text(delta["content"])
                for fragment in delta.get("tool_calls") or []:
                    call = calls.setdefault(
                        fragment.get("index", 0), {"id": "", "name": "", "args": ""}
                    )
                    call["id"] = fragment.get("id") or call["id"]
                    function = fragment.get("function") or {}
                    call["name"] += function.get("name") or ""
                    call["args"] += function.get("arguments") or ""
                reply.stop_reason = choice.get("finish_reason") or reply.stop_reason
        if not finished and reply.stop_reason is None:
            raise ModelError("model.bad_response", "The model provider's answer ended early.")
        reply.tool_calls = [
            self._call(c["id"], c["name"], c["args"]) for _, c in sorted(calls.items())
        ]
        reply.stop_reason = self.STOP_REASONS.get(reply.stop_reason, reply.stop_reason)
        return reply


MODELS = {"anthropic": AnthropicModel, "openai": OpenAIModel, "openrouter": OpenAIModel}


# --- the conversation and the loop ----------------------------------------------------


class Conversation:
    """Provider-neutral messages, saved as JSON:
    {"role": "user", "text"} | {"role": "assistant", "text", "tool_calls": [{id, name, input}]}
    | {"role": "tool", "results": [{id, name, output, is_error}]}."""

    def __init__(self, path):
        self.path = path
        self.messages = []
        if path.exists():
            self.messages = json.loads(path.read_text(encoding="utf-8"))["messages"]

    def save(self):
        """Atomically: a reader (or a kill) sees the old file or the new one, never half."""
        temporary = self.path.with_name(self.path.name + ".tmp")
        with open(temporary, "w", encoding="utf-8") as file:
            json.dump({"version": 1, "messages": self.messages}, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, self.path)


def system_prompt(directory):
    prompt = SYSTEM_PROMPT.format(directory=directory)
    try:
        instructions = (directory / "AGENTS.md").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return prompt
    return f"{prompt}\n\nInstructions from AGENTS.md:\n\n{instructions}"


def relative(path, directory):
    relpath = os.path.relpath(path, directory)
    return None if relpath == ".." or relpath.startswith("../") else relpath


def run_turn(config, events, conversation, directory, session_id=""):
    model = MODELS[config.model_kind](config)
    system = system_prompt(directory)
    ctx = Context(directory, config, session_id)
    usage = {"input_tokens": 0, "output_tokens": 0}
    steps = 0
    while True:
        steps += 1
        try:
            reply = model.complete(system, conversation.messages, events.delta)
        except ModelRequestRejected:
            events.flush()
            stop_reason = "approval_rejected"
            break
        usage["input_tokens"] += reply.input_tokens
        usage["output_tokens"] += reply.output_tokens
        events.flush()
        if reply.text:
            events.emit("assistant_text", {"text": reply.text})
        calls = reply.tool_calls
        conversation.messages.append({"role": "assistant", "text": reply.text, "tool_calls": calls})
        if not calls:
            conversation.save()
            stop_reason = reply.stop_reason or "end_turn"
            break
        results = []
        for call in calls:
            events.emit(
                "tool_call", {"id": call["id"], "name": call["name"], "input": call["input"]}
            )
            result = execute(ctx, call)
            for path in result.changed:
                if relpath := relative(path, directory):
                    events.emit("file_changed", {"path": relpath})
            outcome = {
                "id": call["id"],
                "name": call["name"],
                "output": result.output,
                "is_error": result.is_error,
            }
            events.emit("tool_result", outcome)
            results.append(outcome)
        conversation.messages.append({"role": "tool", "results": results})
        conversation.save()  # a whole step: the calls and their results
        if steps >= config.max_steps:
            stop_reason = "max_steps"
            break
    events.emit("turn_finished", {"stop_reason": stop_reason, "steps": steps, "usage": usage})


def on_sigterm(signum, frame):
    global _sigterm_pending
    if _starting:  # start_in_group handles it as soon as the new group is recorded
        _sigterm_pending = True
        return
    for pgid in list(_running_groups):
        kill_group(pgid)
    os._exit(EXIT_TERMINATED)  # nothing half-written: files are replaced atomically


def main(argv=None):
    parser = argparse.ArgumentParser(description="Quor's agent runtime (one user turn).")
    parser.add_argument("--session-id", required=True)
    parser.add_argument("--turn", type=int, help="the turn this run is for (its first seq)")
    parser.add_argument("--session-dir", required=True)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, on_sigterm)

    directory = Path(args.session_dir).resolve()
    message_path = directory / ".quor" / "next-message.txt"
    try:
        text = message_path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return 0

    config = Config(os.environ)
    if urllib.parse.urlsplit(config.api_url).scheme not in ("http", "https"):
        print("agent: QUOR_API_URL is not an http(s) URL", file=sys.stderr)
        return EXIT_QUOR_UNREACHABLE
    events = Events(config, args.session_id, args.turn)
    events.start_heartbeat(config.heartbeat_interval)
    try:
        if config.problems:  # the message stays, for a run with a better configuration
            return report(events, "runtime.misconfigured", " ".join(config.problems))
        conversation = Conversation(directory / ".quor" / "conversation.json")
        if text.strip():
            conversation.messages.append({"role": "user", "text": text})
            conversation.save()
        message_path.unlink(missing_ok=True)
        if text.strip():
            run_turn(config, events, conversation, directory, args.session_id)
        return 0
    except ModelError as exc:
        return report(events, exc.code, scrub(exc.message, config.secrets))
    except QuorUnreachable as exc:
        print(f"agent: {exc}", file=sys.stderr)
        return EXIT_QUOR_UNREACHABLE
    except Exception as exc:
        traceback.print_exc()
        message = f"The agent runtime failed: {type(exc).__name__}: {exc}"
        return report(events, "runtime.crashed", scrub(message, config.secrets))


def report(events, code, message):
    """Posts an `error` event; the exit status that follows it."""
    try:
        events.emit("error", {"code": code, "message": message})
    except QuorUnreachable as exc:
        print(f"agent: {exc}", file=sys.stderr)
        return EXIT_QUOR_UNREACHABLE
    return EXIT_ERROR_EVENT


if __name__ == "__main__":
    sys.exit(main())
