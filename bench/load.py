#!/usr/bin/env python3
"""Load: N members use Quor at once through its public API, as an integration would.

    flock /tmp/quor-pytest.lock .venv/bin/python bench/load.py
        [--users 10,25,50] [--model-seconds 2] [--timeout 900]

Runs on bench/concurrent_turns.py's stack and environment (daphne, one Celery worker of
concurrency 4, the egress proxy, real Docker sandboxes; its database, Redis db,
deployment, subnet and ports: see there), with a fake App beside it: a plain HTTP
server on 127.0.0.1:32091, let through the proxy's private allowlist and registered as
a custom App of the organization, so that each of its requests is parked for approval.

At each level, N new members start at the same instant (a barrier) and each, with its
own API token:
1. creates a session with the App selected (POST /api/v1/sessions/); the scripted model
   (streaming, the Anthropic Messages API, 1 500-character texts, `--model-seconds`
   per call) has the agent write a file of 20 KB, run a command that makes a file of
   1 MB, run a command that calls the App (it parks), and finish;
2. answers its approval request (polls GET .../approvals/?status=pending, then POST
   /api/v1/approvals/<id>/decision/ approve_once), and waits for the turn's end;
3. reads every event of the session (GET .../events/, paginated): their seq must run
   1..n without a gap (a lost event) or a repeat;
4. downloads the 1 MB file (GET .../files/content) and checks its size;
5. runs five commands (POST .../exec/, `true`);
6. puts its sandbox to sleep (the sandboxes queue's `sleep_sandbox`, as beat would after
   the idle time) and wakes it (POST /api/v1/sandbox/), each until the new state shows.

Prints per level: each step's latency percentiles, the operations per second over the
level, every error (a step that failed, with the first answer), the events lost, and
the resources used (the host's CPU, the most database connections at once, the memory
of Quor's processes at the end). The sandboxes of a level are removed before the next.
Exits non-zero if anything failed or an event was lost.
"""

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import concurrent_turns as stack_env  # noqa: E402  (sets the environment)
from bench.common import host_cpu_times  # noqa: E402

APP_PORT = 32091
os.environ["QUOR_EGRESS_PRIVATE_ALLOWLIST"] = (
    f"127.0.0.1:{stack_env.MODEL_PORT},127.0.0.1:{APP_PORT}"
)
TEXT = ("Quor keeps the sandbox's credentials outside it; " * 30)[:1500]
SMALL_FILE = "notes.txt"
BIG_FILE = "data.bin"
BIG_SIZE = 1 << 20
# Through the proxy: the sandbox's NO_PROXY names 127.0.0.1, its own loopback.
APP_CALL = (
    "env NO_PROXY= no_proxy= python3 -c 'import urllib.request; print(urllib.request"
    f'.urlopen("http://127.0.0.1:{APP_PORT}/items", timeout=300).read().decode())\''
)
SCRIPT = [
    {
        "text": TEXT,
        "tool_calls": [
            {"name": "write_file", "input": {"path": SMALL_FILE, "content": "x" * 20_000}}
        ],
    },
    {
        "text": TEXT,
        "tool_calls": [
            {
                "name": "run_command",
                "input": {"command": f"head -c {BIG_SIZE} /dev/urandom > {BIG_FILE}"},
            }
        ],
    },
    {
        "text": TEXT,
        "tool_calls": [{"name": "run_command", "input": {"command": APP_CALL}}],
    },
    {"text": TEXT, "usage": {"input_tokens": 12_000, "output_tokens": 900}},
]
STEPS = (
    "session created",
    "approval shown",
    "approval decided",
    "turn finished",
    "events read",
    "download",
    "exec",
    "sleep",
    "wake",
)
POLL = 1.0  # how often a member asks for its approvals and its turn, as an integration would


class FakeApp(ThreadingHTTPServer):
    """The third-party App: answers every GET with a small JSON list, counting them."""

    daemon_threads = True

    def __init__(self):
        self.requests = 0

        class Handler(BaseHTTPRequestHandler):
            def do_GET(handler):  # the server is `self` here
                self.requests += 1
                body = b'{"items": [1, 2, 3]}'
                handler.send_response(200)
                handler.send_header("Content-Type", "application/json")
                handler.send_header("Content-Length", str(len(body)))
                handler.end_headers()
                handler.wfile.write(body)

            def log_message(handler, *args):
                pass

        super().__init__(("127.0.0.1", APP_PORT), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()


class Member:
    """One member's run through the steps; each step's seconds, or its error."""

    def __init__(self, token: str, model_id: str, app_id: int, timeout: float):
        self.token, self.model_id, self.app_id = token, model_id, app_id
        self.deadline = time.monotonic() + timeout
        self.seconds: dict[str, list[float]] = {step: [] for step in STEPS}
        self.errors: list[str] = []
        self.events = 0
        self.lost = 0

    def call(self, step, method, path, body=None, expect=(200,), timeout=120):
        started = time.monotonic()
        status, answer = stack_env.api(method, path, self.token, body, timeout=timeout)
        if status not in expect:
            raise StepFailed(f"{step}: {method} {path} answered {status}: {str(answer)[:200]}")
        return answer, time.monotonic() - started

    def until(self, step, check):
        """Polls `check()` until it returns something; raises after the deadline."""
        while time.monotonic() < self.deadline:
            found = check()
            if found:
                return found
            time.sleep(POLL)
        raise StepFailed(f"{step}: not done before the level's deadline")

    def run(self, barrier: threading.Barrier) -> None:
        barrier.wait()
        try:
            self._run()
        except StepFailed as exc:
            self.errors.append(str(exc))
        except Exception as exc:  # reported, never hidden
            self.errors.append(f"{type(exc).__name__}: {exc}")

    def _run(self) -> None:
        began = time.monotonic()
        session, took = self.call(
            "session created",
            "POST",
            "/api/v1/sessions/",
            {"prompt": "Make the files, then ask the App.", "model": self.model_id,
             "apps": [self.app_id]},
            expect=(201,),
        )  # fmt: skip
        self.seconds["session created"].append(took)
        base = f"/api/v1/sessions/{session['id']}"

        def pending():
            page, _ = self.call("approval shown", "GET", f"{base}/approvals/?status=pending")
            return page["results"]

        approval = self.until("approval shown", pending)[0]
        self.seconds["approval shown"].append(time.monotonic() - began)
        _, took = self.call(
            "approval decided",
            "POST",
            f"/api/v1/approvals/{approval['id']}/decision/",
            {"decision": "approve_once"},
        )
        self.seconds["approval decided"].append(took)

        def finished():
            state, _ = self.call("turn finished", "GET", f"{base}/")
            return state["status"] if state["status"] in stack_env.FINAL_STATUSES else None

        status = self.until("turn finished", finished)
        self.seconds["turn finished"].append(time.monotonic() - began)
        if status != "waiting":
            raise StepFailed(f"turn finished: the session is {status}")

        started = time.monotonic()
        seqs = [event["seq"] for event in stack_env.session_events(self.token, session["id"])]
        self.seconds["events read"].append(time.monotonic() - started)
        self.events = len(seqs)
        self.lost = len(set(range(1, max(seqs, default=0) + 1)) - set(seqs))
        if self.lost or len(seqs) != len(set(seqs)):
            raise StepFailed(f"events read: {self.lost} lost, {len(seqs) - len(set(seqs))} twice")

        started = time.monotonic()
        size = self._download(f"{base}/files/content?path={BIG_FILE}")
        self.seconds["download"].append(time.monotonic() - started)
        if size != BIG_SIZE:
            raise StepFailed(f"download: {size} bytes, not {BIG_SIZE}")

        for _ in range(5):
            result, took = self.call("exec", "POST", f"{base}/exec/", {"argv": ["true"]})
            if result["exit_code"] != 0:
                raise StepFailed(f"exec: exit {result['exit_code']}")
            self.seconds["exec"].append(took)

        sandbox, _ = self.call("sleep", "GET", "/api/v1/sandbox/")
        slept = stack_env.put_to_sleep(self.token, sandbox["id"], timeout=self._left())
        if slept["seconds"] is None:
            raise StepFailed(f"sleep: {slept.get('error')} ({slept['states']})")
        self.seconds["sleep"].append(slept["seconds"])
        woke = stack_env.wake(self.token, timeout=self._left())
        if woke["seconds"] is None:
            raise StepFailed(f"wake: {woke.get('error')} ({woke['states']})")
        self.seconds["wake"].append(woke["seconds"])

    def _download(self, path: str) -> int:
        import urllib.request

        request = urllib.request.Request(  # noqa: S310  (our own daphne)
            stack_env.BASE + path, headers={"Authorization": f"Bearer {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=120) as response:  # noqa: S310
            return len(response.read())

    def _left(self) -> float:
        return max(1.0, self.deadline - time.monotonic())


class StepFailed(Exception):
    pass


def make_app() -> int:
    """The organization's custom App on the fake App's address: every request is Ask."""
    from apps import services as app_services
    from apps.models import App
    from quor.models import Organization

    organization = Organization.objects.get(slug=stack_env.ORG_SLUG)
    App.objects.filter(organization=organization).delete()
    app = app_services.app_create_custom(
        organization=organization,
        name="Bench inventory",
        url_patterns=[f"http://127.0.0.1:{APP_PORT}"],
    )
    return app.pk


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
SANDBOXES_CPU = Path("/sys/fs/cgroup/cpuacct/docker/cpuacct.usage")  # every container's


def cpu_seconds(stack) -> dict[str, float]:
    """CPU seconds so far of Quor's processes (each of the stack's process groups), the
    sandboxes (Docker's cgroup, removed containers included), PostgreSQL (the server and
    the backends it reaped), Redis, Docker's own daemons (live processes only) and this
    bench."""
    groups = {process.pid: name for name, process in stack.processes.items()}
    found = dict.fromkeys([*groups.values(), "PostgreSQL", "Redis", "Docker daemons"], 0.0)
    processes = {}  # pid -> (parent, group, name, own ticks, reaped children's ticks)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            comm, rest = stat.read_text().rsplit(")", 1)
            f = rest.split()
            processes[int(stat.parent.name)] = (
                int(f[1]), int(f[2]), comm.split("(", 1)[1],
                int(f[11]) + int(f[12]), int(f[13]) + int(f[14]),
            )  # fmt: skip
    for parent, group, name, ticks, reaped in processes.values():
        if group in groups:
            found[groups[group]] += ticks / CLOCK_TICKS
        elif name == "postgres":  # the server also counts the backends it reaped
            server = processes.get(parent, (0, 0, ""))[2] != "postgres"
            found["PostgreSQL"] += (ticks + (reaped if server else 0)) / CLOCK_TICKS
        elif name == "redis-server":
            found["Redis"] += ticks / CLOCK_TICKS
        elif name in ("dockerd", "containerd") or name.startswith("containerd-shim"):
            found["Docker daemons"] += ticks / CLOCK_TICKS
    if SANDBOXES_CPU.exists():
        found["sandboxes"] = int(SANDBOXES_CPU.read_text()) / 1e9
    times = os.times()
    found["this bench"] = times.user + times.system
    return found


def memory_of(stack) -> float:
    """MiB resident in Quor's processes (every process of each group)."""
    total = 0
    for process in stack.processes.values():
        result = subprocess.run(  # noqa: S603
            ["ps", "-o", "rss=", "-g", str(process.pid)],  # noqa: S607
            capture_output=True,
            text=True,
        )
        total += sum(int(value) for value in result.stdout.split())
    return total / 1024


def percentiles(values: list[float]) -> str:
    if not values:
        return "—"
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    return f"{statistics.median(ordered) * 1000:.0f} / {p95 * 1000:.0f} / {ordered[-1] * 1000:.0f}"


def run_level(users: int, args, stack, app) -> bool:
    model_id, tokens, _ = stack_env.make_members(users)
    app_id = make_app()
    members = [Member(token, model_id, app_id, args.timeout) for token in tokens]
    barrier = threading.Barrier(users)
    threads = [threading.Thread(target=m.run, args=(barrier,)) for m in members]
    app.requests = 0
    cpu_before, began, by_part = host_cpu_times(), time.monotonic(), cpu_seconds(stack)
    with stack_env.ConnectionPeak() as peak:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    elapsed = time.monotonic() - began
    cpu_after = host_cpu_times()
    used = {part: seconds - by_part.get(part, 0) for part, seconds in cpu_seconds(stack).items()}
    busy = (cpu_after[0] - cpu_before[0]) / max(1, cpu_after[1] - cpu_before[1])
    errors = [error for m in members for error in m.errors]
    lost = sum(m.lost for m in members)
    calls = sum(len(v) for m in members for v in m.seconds.values())
    print(f"\n### {users} users (model {args.model_seconds:g} s per call)\n")
    print("| step | done | median / p95 / max ms |")
    print("| --- | --- | --- |")
    for step in STEPS:
        values = [s for m in members for s in m.seconds[step]]
        print(f"| {step} | {len(values)} | {percentiles(values)} |")
    print(
        f"\n{users} users in {elapsed:.1f} s: {calls / elapsed:.1f} steps/s, "
        f"{sum(1 for m in members if not m.errors) / elapsed * 60:.1f} complete runs/min; "
        f"events read {sum(m.events for m in members)}, lost {lost}; App requests "
        f"{app.requests} (of {users}); errors {len(errors)}"
    )
    print(
        f"resources: host CPU busy {busy:.0%} of {os.cpu_count()} cores; most database "
        f"connections at once {peak.peak}; Quor's processes {memory_of(stack):.0f} MiB "
        f"resident at the end; load average {os.getloadavg()[0]:.2f}"
    )
    print(
        "CPU by part, in cores over the level: "
        + ", ".join(f"{part} {seconds / elapsed:.2f}" for part, seconds in used.items())
    )
    for error in errors[:10]:
        print(f"  error: {error}")
    if len(errors) > 10:
        print(f"  ... and {len(errors) - 10} more")
    with contextlib.suppress(Exception):
        from sandboxes.backends.docker import DockerBackend

        backend = DockerBackend()
        for instance in backend.list_instances():
            backend.destroy(instance.sandbox_id, remove_workspace=True)
    return not errors and not lost and app.requests == users


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", default="10,25,50", help="levels, comma-separated")
    parser.add_argument("--model-seconds", type=float, default=2, help="per model call")
    parser.add_argument("--timeout", type=float, default=900, help="per level, seconds")
    args = parser.parse_args()
    levels = [int(n) for n in args.users.split(",")]
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda signum, frame: sys.exit(128 + signum))
    began = time.monotonic()
    print(
        f"{datetime.now().astimezone():%Y-%m-%d %H:%M %Z}, {os.cpu_count()} CPUs, load "
        f"average {os.getloadavg()[0]:.2f}; levels {levels}",
        flush=True,
    )
    stack_env.prepare(APP_PORT)
    server = stack_env.start_model(args.model_seconds)
    server.script = SCRIPT
    app = FakeApp()
    stack = stack_env.Stack()
    passed = True
    try:
        stack.start()
        print(f"  stack up after {time.monotonic() - began:.0f} s", flush=True)
        for users in levels:
            passed = run_level(users, args, stack, app) and passed
    finally:
        app.shutdown()
        stack_env.tear_down(stack, server)
    return stack_env.verdict(passed, began)


if __name__ == "__main__":
    sys.exit(main())
