"""The agent runtime (deploy/sandbox/runtime/agent.py) run on the host, against a fake
model provider and a fake of Quor's events API: no Docker, no database."""

import ast
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from sandboxes.scripted_model import ScriptedModelServer, demo_script
from tests.environment import free_port
from tests.fakes import make_test_ca

AGENT = Path(__file__).resolve().parents[2] / "deploy" / "sandbox" / "runtime" / "agent.py"
PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
TOKEN = "quor-placeholder-token-1234"
KEYS = {
    "anthropic": ("ANTHROPIC_API_KEY", "sk-ant-placeholder-key-5678"),
    "openai": ("OPENAI_API_KEY", "sk-openai-placeholder-key-5678"),
    "openrouter": ("OPENROUTER_API_KEY", "sk-or-placeholder-key-5678"),
}
SESSION_ID = "0b7c6f0e-session"
EVENTS_PATH = f"/api/v1/runtime/sessions/{SESSION_ID}/events/"
WEBAPPS_PATH = f"/api/v1/runtime/sessions/{SESSION_ID}/webapps/"
HEARTBEAT_PATH = f"/api/v1/runtime/sessions/{SESSION_ID}/heartbeat/"
SEARCH_PATH = "/api/v1/runtime/knowledge/search"
WEBAPP_URL = "http://wfeedface.apps.test/"
ALL_INTERFACES = "0.0.0.0"  # noqa: S104  (where web apps must listen)


class EventsRecorder:
    """Quor's events API: accepts posts with the right token, records their events; and
    its web app registrations (in `webapps`), the times of heartbeats (answered with
    `heartbeat_status`) and knowledge searches (answered with `search_answer`)."""

    def __init__(self):
        self.posts: list[list[dict]] = []
        self.webapps: list[dict] = []
        self.searches: list[dict] = []
        self.search_answer = (200, {"results": []})
        self.heartbeats: list[float] = []
        self.heartbeat_status = 204
        self.rejected = 0
        self.status = 200
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status, answer = recorder.status, b"{}"
                if self.headers.get("Authorization") != f"Bearer {TOKEN}" or self.path not in (
                    EVENTS_PATH,
                    WEBAPPS_PATH,
                    HEARTBEAT_PATH,
                    SEARCH_PATH,
                ):
                    recorder.rejected += 1
                    status = 401
                elif self.path == HEARTBEAT_PATH:
                    recorder.heartbeats.append(time.monotonic())
                    status, answer = recorder.heartbeat_status, b""
                elif self.path == SEARCH_PATH:
                    recorder.searches.append(json.loads(body))
                    status, answer = recorder.search_answer
                    answer = json.dumps(answer).encode()
                elif status == 200 and self.path == WEBAPPS_PATH:
                    registration = json.loads(body)
                    recorder.webapps.append(registration)
                    status = 201
                    answer = json.dumps({**registration, "url": WEBAPP_URL}).encode()
                elif status == 200:
                    recorder.posts.append(json.loads(body)["events"])
                self.send_response(status)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def events(self) -> list[dict]:
        return [event for post in self.posts for event in post]

    def kinds(self) -> list[str]:
        return [event["kind"] for event in self.events if event["kind"] != "assistant_text_delta"]

    def of_kind(self, kind) -> list[dict]:
        return [event["payload"] for event in self.events if event["kind"] == kind]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def quor():
    recorder = EventsRecorder()
    yield recorder
    recorder.close()


@pytest.fixture
def model():
    server = ScriptedModelServer("127.0.0.1", 0)
    yield server
    server.close()


@pytest.fixture
def session_dir(tmp_path):
    directory = tmp_path / "session"
    (directory / ".quor").mkdir(parents=True)
    return directory


def agent_env(quor, model, session_dir, kind="anthropic", **extra) -> dict:
    """The runtime's environment: no proxy variables, nothing inherited but PATH."""
    key_variable, key = KEYS[kind]
    home = session_dir.parent / "home"
    home.mkdir(exist_ok=True)
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "QUOR_API_URL": quor.url,
        "QUOR_API_TOKEN": TOKEN,
        "QUOR_MODEL_KIND": kind,
        "QUOR_MODEL_BASE_URL": model.base_url(kind),
        "QUOR_MODEL_NAME": "fake-model-1",
        key_variable: key,
        **extra,
    }


def start_agent(session_dir, env, message="Write and run a small program.") -> subprocess.Popen:
    if message is not None:
        (session_dir / ".quor" / "next-message.txt").write_text(message)
    return subprocess.Popen(
        [PYTHON, str(AGENT), "--session-id", SESSION_ID, "--session-dir", str(session_dir)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_agent(
    session_dir, env, message="Write and run a small program."
) -> subprocess.CompletedProcess:
    process = start_agent(session_dir, env, message)
    stdout, stderr = process.communicate(timeout=60)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def wait_for(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.02)


def process_is_gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def assert_demo_turn(quor, session_dir):
    assert quor.kinds() == [
        "assistant_text",
        "tool_call",
        "file_changed",
        "tool_result",
        "assistant_text",
        "tool_call",
        "tool_result",
        "assistant_text",
        "turn_finished",
    ]
    calls, results = quor.of_kind("tool_call"), quor.of_kind("tool_result")
    assert calls[0]["name"] == "write_file" and calls[0]["input"]["path"] == "hello.py"
    assert quor.of_kind("file_changed") == [{"path": "hello.py"}]
    assert results[0]["id"] == calls[0]["id"] and results[0]["is_error"] is False
    assert calls[1]["name"] == "run_command"
    assert results[1] == {
        "id": calls[1]["id"],
        "name": "run_command",
        "output": "The sum of the squares of 1 to 10 is 385.\n[exit code: 0]",
        "is_error": False,
    }
    assert "385" in quor.of_kind("assistant_text")[-1]["text"]
    assert quor.of_kind("turn_finished") == [
        {
            "stop_reason": "end_turn",
            "steps": 3,
            "usage": {"input_tokens": 100 + 200 + 300, "output_tokens": 10 + 20 + 30},
        }
    ]
    assert (session_dir / "hello.py").exists()
    assert not (session_dir / ".quor" / "next-message.txt").exists()
    assert quor.rejected == 0


def test_an_anthropic_run_writes_a_program_runs_it_and_reports_its_output(quor, model, session_dir):
    model.script = demo_script()
    result = run_agent(session_dir, agent_env(quor, model, session_dir, "anthropic"))

    assert result.returncode == 0, result.stderr
    assert_demo_turn(quor, session_dir)
    first = model.requests[0]
    assert first["path"] == "/v1/messages"
    assert first["headers"]["x-api-key"] == KEYS["anthropic"][1]
    assert first["headers"]["anthropic-version"] == "2023-06-01"
    assert first["body"]["stream"] is True and first["body"]["model"] == "fake-model-1"
    assert {tool["name"] for tool in first["body"]["tools"]} == {
        "run_command",
        "read_file",
        "write_file",
        "edit_file",
        "list_files",
        "search_company_knowledge",
        "start_web_app",
    }
    assert all("input_schema" in tool for tool in first["body"]["tools"])
    last = model.requests[-1]["body"]["messages"]
    assert [m["role"] for m in last] == ["user", "assistant", "user", "assistant", "user"]
    tool_result = last[-1]["content"][0]
    assert tool_result["type"] == "tool_result" and "385" in tool_result["content"]


def test_an_openai_run_writes_a_program_runs_it_and_reports_its_output(quor, model, session_dir):
    model.script = demo_script()
    result = run_agent(session_dir, agent_env(quor, model, session_dir, "openai"))

    assert result.returncode == 0, result.stderr
    assert_demo_turn(quor, session_dir)
    first = model.requests[0]
    assert first["path"] == "/v1/chat/completions"
    assert first["headers"]["authorization"] == f"Bearer {KEYS['openai'][1]}"
    assert first["body"]["stream_options"] == {"include_usage": True}
    assert first["body"]["tools"][0]["type"] == "function"
    assert first["body"]["messages"][0]["role"] == "system"
    last = model.requests[-1]["body"]["messages"]
    assert [m["role"] for m in last] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert last[-1]["tool_call_id"] == last[-2]["tool_calls"][0]["id"]
    assert "385" in last[-1]["content"]


def test_openrouter_over_tls_trusts_the_ca_of_ssl_cert_file(quor, session_dir, tmp_path):
    ca, cert, key = make_test_ca(tmp_path / "ca", ["localhost"])
    server = ScriptedModelServer("127.0.0.1", 0, tls=(cert, key))
    try:
        server.script = demo_script()
        env = agent_env(quor, server, session_dir, "openrouter", SSL_CERT_FILE=str(ca))
        env["QUOR_MODEL_BASE_URL"] = server.base_url("openrouter", host="localhost")
        result = run_agent(session_dir, env)
    finally:
        server.close()

    assert result.returncode == 0, result.stderr
    assert_demo_turn(quor, session_dir)
    assert server.requests[0]["headers"]["authorization"] == f"Bearer {KEYS['openrouter'][1]}"


def test_a_follow_up_run_continues_the_conversation(quor, model, session_dir):
    model.script = [{"text": "Hello! What shall we build?"}, {"text": "A calculator, then."}]
    env = agent_env(quor, model, session_dir)
    assert run_agent(session_dir, env, "Hi there").returncode == 0
    assert run_agent(session_dir, env, "Something small").returncode == 0

    second = model.requests[1]["body"]["messages"]
    assert second == [
        {"role": "user", "content": [{"type": "text", "text": "Hi there"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Hello! What shall we build?"}]},
        {"role": "user", "content": [{"type": "text", "text": "Something small"}]},
    ]
    assert [e["text"] for e in quor.of_kind("assistant_text")] == [
        "Hello! What shall we build?",
        "A calculator, then.",
    ]
    saved = json.loads((session_dir / ".quor" / "conversation.json").read_text())
    assert [m["role"] for m in saved["messages"]] == ["user", "assistant", "user", "assistant"]


def test_text_deltas_are_batched_into_fewer_posts_than_the_stream_has_deltas(
    quor, model, session_dir
):
    text = "".join(f"word{i} " for i in range(400))
    model.script = [{"text": text}]
    model.chunk_size = 1  # one delta per character
    result = run_agent(session_dir, agent_env(quor, model, session_dir))

    assert result.returncode == 0, result.stderr
    delta_posts = [p for p in quor.posts if any(e["kind"] == "assistant_text_delta" for e in p)]
    assert 1 <= len(delta_posts) < len(text) / 10
    deltas = "".join(e["text"] for e in quor.of_kind("assistant_text_delta"))
    assert deltas == text == quor.of_kind("assistant_text")[0]["text"]


def test_a_slow_stream_has_its_deltas_posted_while_it_streams(quor, model, session_dir):
    model.script = [{"text": "x" * 60}]
    model.chunk_size, model.chunk_delay = 1, 0.01  # about 0.6 s of streaming
    result = run_agent(session_dir, agent_env(quor, model, session_dir))

    assert result.returncode == 0, result.stderr
    delta_posts = [p for p in quor.posts if any(e["kind"] == "assistant_text_delta" for e in p)]
    assert 2 <= len(delta_posts) < 60
    assert "".join(e["text"] for e in quor.of_kind("assistant_text_delta")) == "x" * 60


def test_command_output_is_bounded_with_a_truncated_marker(quor, model, session_dir):
    command = "python3 -c \"print('start'); print('x' * 100000); print('end')\""
    model.script = [{"tool_calls": [{"name": "run_command", "input": {"command": command}}]}]
    result = run_agent(session_dir, agent_env(quor, model, session_dir, QUOR_OUTPUT_LIMIT="1000"))

    assert result.returncode == 0, result.stderr
    [output] = [r["output"] for r in quor.of_kind("tool_result")]
    assert len(output.encode()) <= 1000
    assert output.startswith("start\n") and "[truncated]" in output
    assert output.endswith("end\n[exit code: 0]")


def test_a_command_that_runs_too_long_is_killed_at_its_timeout(quor, model, session_dir):
    calls = [{"name": "run_command", "input": {"command": "echo begun; sleep 30"}}]
    model.script = [{"tool_calls": calls}, {"text": "It timed out."}]
    started = time.monotonic()
    result = run_agent(session_dir, agent_env(quor, model, session_dir, QUOR_COMMAND_TIMEOUT="1"))

    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started < 10
    [tool_result] = quor.of_kind("tool_result")
    assert tool_result["is_error"] is True
    assert tool_result["output"].startswith("begun\n")
    assert "timed out after 1 seconds" in tool_result["output"]


def test_edit_file_replaces_text_that_occurs_exactly_once(quor, model, session_dir):
    edit = lambda old: {"name": "edit_file", "input": {"path": "notes.txt", "old": old, "new": "1"}}  # noqa: E731
    model.script = [
        {
            "tool_calls": [
                {"name": "write_file", "input": {"path": "notes.txt", "content": "one two two"}},
                edit("two"),
                edit("three"),
                edit("one"),
            ]
        },
        {"text": "Done."},
    ]
    result = run_agent(session_dir, agent_env(quor, model, session_dir))

    assert result.returncode == 0, result.stderr
    results = quor.of_kind("tool_result")
    assert [r["is_error"] for r in results] == [False, True, True, False]
    assert "occurs 2 times" in results[1]["output"]
    assert "does not occur" in results[2]["output"]
    assert (session_dir / "notes.txt").read_text() == "1 two two"
    assert quor.of_kind("file_changed") == [{"path": "notes.txt"}, {"path": "notes.txt"}]


@pytest.mark.parametrize("kind", ["anthropic", "openai"])
@pytest.mark.parametrize(
    ("status", "code"),
    [(401, "model.unauthorized"), (429, "model.rate_limited"), (500, "model.unavailable")],
)
def test_a_provider_failure_gives_one_error_event_and_exit_code_2(
    quor, model, session_dir, kind, status, code
):
    key = KEYS[kind][1]
    model.fail_with = (status, {"error": {"message": f"Trouble with key {key} (sorry)"}})
    result = run_agent(session_dir, agent_env(quor, model, session_dir, kind))

    assert result.returncode == 2, result.stderr
    assert quor.kinds() == ["error"]
    [error] = quor.of_kind("error")
    assert error["code"] == code
    assert "Trouble with key" in error["message"] and str(status) in error["message"]
    for secret in (key, TOKEN, "x-api-key", "Bearer"):
        assert secret not in error["message"]


@pytest.mark.parametrize("kind", ["anthropic", "openai"])
def test_a_model_request_the_user_rejected_ends_the_turn_without_an_error(
    quor, model, session_dir, kind
):
    # The egress proxy's refusal when the user rejected the parked request (an App
    # covering the model provider's address): the user's choice, not a failure.
    refusal = {"error": {"code": "approvals.rejected", "message": "The user rejected it."}}
    model.fail_with = (403, refusal)
    result = run_agent(session_dir, agent_env(quor, model, session_dir, kind))

    assert result.returncode == 0, result.stderr
    assert quor.kinds() == ["turn_finished"]
    assert quor.of_kind("turn_finished")[0]["stop_reason"] == "approval_rejected"


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (403, "approvals.expired"),
        (403, "approvals.unavailable"),
        (403, "apps.action_denied"),
        (403, "egress.credential_unavailable"),
        (503, "egress.not_ready"),
    ],
)
def test_a_model_request_the_proxy_refused_fails_with_the_proxys_code(
    quor, model, session_dir, status, code
):
    # Not the provider refusing Quor's credentials (model.unauthorized): the egress
    # proxy did not send the request, and its code says why.
    model.fail_with = (status, {"error": {"code": code, "message": "Not sent; do not retry."}})
    result = run_agent(session_dir, agent_env(quor, model, session_dir))

    assert result.returncode == 2, result.stderr
    assert quor.kinds() == ["error"]
    [error] = quor.of_kind("error")
    assert error["code"] == code
    assert "Not sent; do not retry." in error["message"] and str(status) in error["message"]


def test_a_providers_own_403_with_a_code_stays_model_unauthorized(quor, model, session_dir):
    refusal = {"error": {"code": "unsupported_country_region_territory", "message": "No."}}
    model.fail_with = (403, refusal)
    result = run_agent(session_dir, agent_env(quor, model, session_dir, "openai"))

    assert result.returncode == 2, result.stderr
    assert [e["code"] for e in quor.of_kind("error")] == ["model.unauthorized"]


def test_a_silent_provider_gives_a_timeout_error(quor, model, session_dir):
    model.stall_seconds = 3
    model.script = [{"text": "too late"}]
    result = run_agent(session_dir, agent_env(quor, model, session_dir, QUOR_MODEL_TIMEOUT="1"))

    assert result.returncode == 2, result.stderr
    assert [e["code"] for e in quor.of_kind("error")] == ["model.timeout"]


def test_sigterm_during_a_long_command_ends_the_runtime_within_2_seconds_and_kills_it(
    quor, model, session_dir
):
    command = "sleep 60 & echo $! > sleep.pid; wait"
    model.script = [{"tool_calls": [{"name": "run_command", "input": {"command": command}}]}]
    process = start_agent(session_dir, agent_env(quor, model, session_dir))
    try:
        pid_file = session_dir / "sleep.pid"
        wait_for(lambda: pid_file.exists() and pid_file.read_text().strip())
        sleep_pid = int(pid_file.read_text())
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=2) == 143
        assert time.monotonic() - started < 2
    finally:
        process.kill()
        process.communicate()

    wait_for(lambda: process_is_gone(sleep_pid), timeout=1)
    assert quor.kinds() == ["tool_call"]
    saved = json.loads((session_dir / ".quor" / "conversation.json").read_text())
    assert [m["role"] for m in saved["messages"]] == ["user"]  # the unfinished step is not saved


def test_an_agent_busy_with_a_long_command_sends_heartbeats_and_none_while_it_posts_events(
    quor, model, session_dir
):
    model.script = [
        {"tool_calls": [{"name": "run_command", "input": {"command": "sleep 3.5"}}]},
        {"text": "Done."},
    ]
    env = agent_env(quor, model, session_dir, QUOR_HEARTBEAT_INTERVAL="1")
    started = time.monotonic()
    result = run_agent(session_dir, env)

    assert result.returncode == 0, result.stderr
    assert quor.kinds()[-1] == "turn_finished"
    first, *while_the_command_ran = quor.heartbeats
    assert first - started < 1  # at once: a turn whose agent never started is found early
    assert 2 <= len(while_the_command_ran) <= 4  # then one a second
    assert all(later - first >= 1 for later in while_the_command_ran)
    assert quor.rejected == 0


def test_an_agent_whose_turn_was_ended_without_it_stops_with_its_commands(quor, model, session_dir):
    command = "sleep 60 & echo $! > sleep.pid; wait"
    model.script = [{"tool_calls": [{"name": "run_command", "input": {"command": command}}]}]
    process = start_agent(
        session_dir, agent_env(quor, model, session_dir, QUOR_HEARTBEAT_INTERVAL="1")
    )
    try:
        pid_file = session_dir / "sleep.pid"
        wait_for(lambda: pid_file.exists() and pid_file.read_text().strip())
        sleep_pid = int(pid_file.read_text())
        quor.heartbeat_status = 409  # cancelled, or found lost, while the command runs
        assert process.wait(timeout=5) == 143
    finally:
        process.kill()
        process.communicate()

    wait_for(lambda: process_is_gone(sleep_pid), timeout=1)
    assert "turn_finished" not in quor.kinds()


def test_a_missing_next_message_exits_0_without_events(quor, model, session_dir):
    result = run_agent(session_dir, agent_env(quor, model, session_dir), message=None)

    assert result.returncode == 0, result.stderr
    assert quor.posts == [] and quor.rejected == 0
    assert model.requests == []


def test_an_unreachable_quor_ends_the_run_with_exit_code_3(quor, model, session_dir):
    quor.status = 503
    model.script = [{"text": "Nobody is listening."}]
    result = run_agent(session_dir, agent_env(quor, model, session_dir))

    assert result.returncode == 3
    assert "Could not post events to Quor" in result.stderr


def test_the_step_limit_ends_the_turn(quor, model, session_dir):
    call = {"name": "list_files", "input": {}}
    model.script = [{"tool_calls": [call]}] * 5
    result = run_agent(session_dir, agent_env(quor, model, session_dir, QUOR_MAX_STEPS="2"))

    assert result.returncode == 0, result.stderr
    assert len(model.requests) == 2
    [finished] = quor.of_kind("turn_finished")
    assert finished["stop_reason"] == "max_steps" and finished["steps"] == 2
    assert quor.of_kind("tool_result")[0]["output"] == ".quor/"


def test_the_system_prompt_names_the_session_dir_and_carries_agents_md(quor, model, session_dir):
    (session_dir / "AGENTS.md").write_text("Always answer in haiku.")
    model.script = [{"text": "Ok."}]
    assert run_agent(session_dir, agent_env(quor, model, session_dir)).returncode == 0

    system = model.requests[0]["body"]["system"]
    assert str(session_dir) in system and "Always answer in haiku." in system


@pytest.mark.parametrize("program", [AGENT, AGENT.parent / "quor_search.py"])
def test_the_runtime_imports_only_the_standard_library_and_its_own_modules(program):
    tree = ast.parse(program.read_text())
    modules = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    modules |= {
        node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
    }
    own = {path.stem for path in AGENT.parent.glob("*.py")}
    assert modules <= sys.stdlib_module_names | own


def test_the_runtime_uses_the_proxy_even_for_hosts_in_no_proxy(tmp_path):
    """Model and Quor addresses on the host's loopback (development) must go through
    the egress proxy: a recording proxy sees both requests despite NO_PROXY."""
    import socketserver

    seen = []

    class Proxy(socketserver.StreamRequestHandler):
        def handle(self):
            seen.append(self.rfile.readline().decode().split()[1])
            self.wfile.write(
                b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            )

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    session_dir = tmp_path / "session"
    (session_dir / ".quor").mkdir(parents=True)
    (session_dir / ".quor" / "next-message.txt").write_text("hi")
    proxy = f"http://u:p@127.0.0.1:{server.server_address[1]}"
    env = {
        "PATH": os.environ["PATH"],
        "HTTP_PROXY": proxy,
        "HTTPS_PROXY": proxy,
        "NO_PROXY": "localhost,127.0.0.1",
        "QUOR_API_URL": "http://127.0.0.1:9",
        "QUOR_API_TOKEN": "t",
        "QUOR_MODEL_KIND": "anthropic",
        "QUOR_MODEL_BASE_URL": "http://127.0.0.1:8",
        "QUOR_MODEL_NAME": "m",
        "ANTHROPIC_API_KEY": "k",
    }
    subprocess.run(
        [sys.executable, str(AGENT), "--session-id", "s", "--session-dir", str(session_dir)],
        env=env,
        timeout=60,
    )
    server.shutdown()
    assert "http://127.0.0.1:8/v1/messages" in seen
    assert any(
        url.startswith("http://127.0.0.1:9/api/v1/runtime/sessions/s/events/") for url in seen
    )


# --- search_company_knowledge and quor-search ---------------------------------------

FOUND = {
    "results": [
        {
            "document": 7, "title": "Travel policy", "url": "https://intranet.test/travel",
            "passage": "Book economy class for flights under six hours.", "source": 1,
            "source_name": "Handbook", "type": "pdf", "updated_at": "2026-11-30T10:00:00Z",
        }
    ]
}  # fmt: skip


def test_the_agent_searches_company_knowledge_through_quor_with_its_placeholder(
    quor, model, session_dir
):
    quor.search_answer = (200, FOUND)
    call = {"name": "search_company_knowledge", "input": {"query": "travel flights", "limit": 3}}
    model.script = [{"tool_calls": [call]}, {"text": "Economy class."}]
    result = run_agent(session_dir, agent_env(quor, model, session_dir))
    assert result.returncode == 0, result.stderr
    assert quor.searches == [{"query": "travel flights", "limit": 3}]
    [tool_result] = quor.of_kind("tool_result")
    assert "1. Travel policy (Handbook · pdf · 2026-11-30)" in tool_result["output"]
    assert "Book economy class for flights under six hours." in tool_result["output"]
    assert not tool_result.get("is_error")


def test_a_search_quor_refuses_is_a_tool_error_the_model_reads(quor, model, session_dir):
    quor.search_answer = (
        400,
        {"error": {"code": "knowledge.invalid_query", "message": "The query is empty."}},
    )
    call = {"name": "search_company_knowledge", "input": {"query": " "}}
    model.script = [{"tool_calls": [call]}, {"text": "Sorry."}]
    result = run_agent(session_dir, agent_env(quor, model, session_dir))
    assert result.returncode == 0, result.stderr
    [tool_result] = quor.of_kind("tool_result")
    assert tool_result["is_error"]
    assert "HTTP 400" in tool_result["output"] and "The query is empty." in tool_result["output"]


def run_quor_search(quor, *args):
    env = {"PATH": os.environ["PATH"], "QUOR_API_URL": quor.url, "QUOR_API_TOKEN": TOKEN}
    return subprocess.run(
        [PYTHON, str(AGENT.parent / "quor_search.py"), *args],
        env=env, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip


def test_quor_search_prints_results_for_people_and_json_for_scripts(quor):
    quor.search_answer = (200, FOUND)
    people = run_quor_search(quor, "travel", "flights", "--type", "pdf", "--source", "1")
    assert people.returncode == 0, people.stderr
    assert people.stdout.splitlines() == [
        "1. Travel policy (Handbook · pdf · 2026-11-30)",
        "   https://intranet.test/travel",
        "   Book economy class for flights under six hours.",
    ]
    assert quor.searches[-1] == {
        "query": "travel flights",
        "limit": 10,
        "sources": [1],
        "types": ["pdf"],
    }
    scripts = run_quor_search(quor, "--json", "travel")
    assert json.loads(scripts.stdout) == FOUND


def test_quor_search_says_what_went_wrong_and_exits_1(quor):
    quor.search_answer = (200, {"results": []})
    assert run_quor_search(quor, "nothing").stdout.strip() == "No document you may read matches."
    quor.search_answer = (
        401,
        {"error": {"code": "authentication_failed", "message": "Unknown credential."}},
    )
    refused = run_quor_search(quor, "x")
    assert refused.returncode == 1 and refused.stdout == ""
    assert "quor-search: Quor refused the search (HTTP 401): Unknown credential." in refused.stderr


# --- start_web_app --------------------------------------------------------------------


def web_app_turn(quor, model, session_dir, command, port):
    call = {"name": "start_web_app", "input": {"command": command, "port": port}}
    model.script = [{"tool_calls": [call]}, {"text": "Done."}]
    result = run_agent(session_dir, agent_env(quor, model, session_dir))
    assert result.returncode == 0, result.stderr
    [tool_result] = quor.of_kind("tool_result")
    return tool_result


def port_answers(port) -> bool:
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def test_start_web_app_starts_a_server_that_outlives_the_turn_and_registers_it(
    quor, model, session_dir
):
    import urllib.request

    port = free_port(ALL_INTERFACES)
    command = f"python3 -m http.server --bind 0.0.0.0 {port}"
    (session_dir / "index.html").write_text("<h1>hello from the app</h1>")
    tool_result = web_app_turn(quor, model, session_dir, command, port)
    group = re.search(r"process group (\d+)", tool_result["output"])
    try:
        assert tool_result["is_error"] is False, tool_result["output"]
        assert WEBAPP_URL in tool_result["output"]
        assert quor.webapps == [{"port": port, "command": command}]
        assert quor.rejected == 0
        # The runtime has exited; the server still serves the session directory.
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as response:
            assert b"hello from the app" in response.read()
        assert (session_dir / ".quor" / f"webapp-{port}.log").exists()
    finally:
        if group:
            os.killpg(int(group.group(1)), signal.SIGKILL)
    assert group, tool_result["output"]
    wait_for(lambda: not port_answers(port))


def test_a_web_app_on_loopback_only_is_stopped_with_a_hint_to_bind_0_0_0_0(
    quor, model, session_dir
):
    port = free_port(ALL_INTERFACES)
    command = f"echo starting the app; exec python3 -m http.server --bind 127.0.0.1 {port}"
    tool_result = web_app_turn(quor, model, session_dir, command, port)

    assert tool_result["is_error"] is True
    assert "127.0.0.1" in tool_result["output"] and ALL_INTERFACES in tool_result["output"]
    assert "starting the app" in tool_result["output"]  # the end of its log
    assert quor.webapps == []
    assert not port_answers(port)  # stopped


def test_a_web_app_command_that_fails_is_reported_with_its_log(quor, model, session_dir):
    started = time.monotonic()
    tool_result = web_app_turn(quor, model, session_dir, "echo no such app >&2; exit 3", 8999)

    assert time.monotonic() - started < 10  # no waiting for the port
    assert tool_result["is_error"] is True
    assert "exited with code 3" in tool_result["output"]
    assert "no such app" in tool_result["output"]
    assert ALL_INTERFACES in model.requests[0]["body"]["tools"][-1]["description"]
    assert quor.webapps == []


def test_start_web_app_refuses_a_port_in_use_and_low_ports(quor, model, session_dir):
    import socket

    with socket.socket() as busy:
        busy.bind((ALL_INTERFACES, 0))
        busy.listen()
        port = busy.getsockname()[1]
        calls = [
            {"name": "start_web_app", "input": {"command": "true", "port": port}},
            {"name": "start_web_app", "input": {"command": "true", "port": 80}},
        ]
        model.script = [{"tool_calls": calls}, {"text": "Done."}]
        result = run_agent(session_dir, agent_env(quor, model, session_dir))

    assert result.returncode == 0, result.stderr
    in_use, low = quor.of_kind("tool_result")
    assert in_use["is_error"] and "already in use" in in_use["output"]
    assert low["is_error"] and "1024" in low["output"]
    assert quor.webapps == []


def test_sigterm_while_a_web_app_starts_stops_it_too(quor, model, session_dir):
    """Registered web apps outlive the turn; one still starting goes with a cancel."""
    pid_file = session_dir / "server.pid"
    command = f"echo $$ > {pid_file}; exec sleep 60"
    call = {
        "name": "start_web_app",
        "input": {"command": command, "port": free_port(ALL_INTERFACES)},
    }
    model.script = [{"tool_calls": [call]}]
    process = start_agent(session_dir, agent_env(quor, model, session_dir))
    wait_for(lambda: pid_file.exists() and pid_file.read_text().strip())
    pid = int(pid_file.read_text())

    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=5) == 143

    def gone():
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        return state == "Z"

    wait_for(gone)


def test_a_sigterm_between_a_commands_start_and_its_record_still_kills_it(monkeypatch, tmp_path):
    """A cancel's SIGTERM that comes after the command started but before its process
    group was recorded (a busy machine makes that window long) still kills it: the
    handler waits for the record instead of leaving the command running after the turn."""
    import importlib.util
    import types

    monkeypatch.syspath_prepend(str(AGENT.parent))  # agent.py imports quor_search
    spec = importlib.util.spec_from_file_location("agent_runtime_under_test", AGENT)
    agent = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(agent)
    exits = []

    def start_then_sigterm(*args, **kwargs):
        process = subprocess.Popen(*args, **kwargs)
        agent.on_sigterm(signal.SIGTERM, None)  # where the signal's handler would run
        return process

    monkeypatch.setattr(agent, "os", types.SimpleNamespace(killpg=os.killpg, _exit=exits.append))
    monkeypatch.setattr(
        agent, "subprocess", types.SimpleNamespace(
            Popen=start_then_sigterm, DEVNULL=subprocess.DEVNULL, STDOUT=subprocess.STDOUT
        ),
    )  # fmt: skip
    process = agent.start_in_group(types.SimpleNamespace(directory=tmp_path), "sleep 60", None)
    assert exits == [agent.EXIT_TERMINATED]
    assert process.wait(timeout=10) == -signal.SIGKILL
