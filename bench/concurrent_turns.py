#!/usr/bin/env python3
"""Concurrent agent turns on the stack as `make dev` runs it, with sleeps and wakes meanwhile.

    flock /tmp/quor-pytest.lock .venv/bin/python bench/concurrent_turns.py
        [--users 20] [--model-seconds 15] [--quick] [--timeout 900]

Starts what `tools/run-dev` starts, on the bench's own environment: daphne, ONE Celery
worker (`celery -A quor worker -Q default,sandboxes,agents --concurrency 4`), the egress
proxy (`manage.py run_egress_proxy`) and, as the model provider, the scripted model
server (`sandboxes/scripted_model.py`, in this process) on 127.0.0.1, reached by the
sandboxes through the proxy's private allowlist as `make dev` reaches its demo model.
Beat is not started: the bench sends the sleeps itself. Real Docker sandboxes
(`quor-sandbox:latest`, `tools/build-sandbox-image --if-missing` first).

Every model call waits `--model-seconds` (15 s by default, as in the issue's figure) and
plays the same script: a `run_command` of `sleep 1`, then a final text; so a turn is two
model calls, plus its sandbox's start (each member is new: the turn creates the sandbox).

1. Before the burst, on the idle stack, three extra members' sandboxes are created
   (POST /api/v1/sandbox/), two are put to sleep through the sandboxes queue
   (`sandboxes.tasks.sleep_sandbox`, sent here with `app.send_task`, after their
   activity time is set back past QUOR_SANDBOX_IDLE_SECONDS so that the task's idle check
   lets them sleep), one of them is woken and put to sleep again: the times of a
   create, a sleep and a wake when nothing else runs.
2. The burst: `--users` members each POST /api/v1/sessions/ at the same instant (a
   barrier); at that same instant the first sleeping sandbox's owner POSTs
   /api/v1/sandbox/ (a wake queued together with the turns). Each session is polled
   (GET /api/v1/sessions/<id>/, every 2 s) until its turn ends; once every session has
   left `pending` (every turn started), the second sleeping sandbox is woken the same way
   and the third (idle, running) one is put to sleep through the sandboxes queue. A wake
   is timed from its POST to the state `running`, a sleep from sending its task to the
   state `sleeping` (GET /api/v1/sandbox/ of the owner, every 0.25 s).
3. Per session, from the start of its POST (this host's clock; the event's `created_at`
   comes from the worker's or daphne's clock on the same host): `session_started` (the
   turn starts: the worker took the task), the agent's first model request (the scripted
   server notes its arrival: the agent is running in its sandbox), the first event of the
   agent, `turn_finished`; and the steps of its start in its new sandbox from the Docker
   Engine's events (`docker events`: container created, started). Also the peak of model calls in
   flight at once, the worker's task run times from its log (and, for each sleep and
   wake during the burst, how long its task was queued), and the log lines at WARNING
   and above.

`--quick` (4 users, 2 s per model call) checks the bench end to end in about 30 s.

Exits non-zero if a turn did not finish with `turn_finished`, or a figure is missing.

Own environment, so it never meets the test suite or other benches: database
quor_bench_turns (created and migrated if missing, left in place), Redis db 8 (emptied at
the start), deployment "benchturns", subnet 10.238.0.0/24, daphne on 127.0.0.1:32000, the
proxy on the subnet's gateway port 32899, the model on 127.0.0.1:32090, scratch directory
/tmp/quor-bench-turns (logs, file store, egress CA). Removes its processes, sandboxes and
Docker network at the end; the members of an earlier run are deleted at the start.
"""

import argparse
import contextlib
import ipaddress
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    ensure_database,
    host_cpu_times,
    port_free,
    port_open,
    remove_network,
    start_process_group,
    stop_process_group,
)

WORK = Path("/tmp/quor-bench-turns")  # noqa: S108  (the bench's own scratch directory)
LOGS = WORK / "logs"
DATABASE = "quor_bench_turns"
DEPLOYMENT = "benchturns"
REDIS_URL = "redis://127.0.0.1:6379/8"
SUBNET = "10.238.0.0/24"  # 10.231-10.237 belong to other deployments and benches here
GATEWAY = str(next(ipaddress.ip_network(SUBNET).hosts()))
WEB_PORT, PROXY_PORT, MODEL_PORT = 32000, 32899, 32090
BASE = f"http://127.0.0.1:{WEB_PORT}"
ORG_SLUG = "turns-bench"
MODEL_NAME = "scripted-bench"
ANCHOR = (
    "before the change (issue 15): 8 members at once, model 15 s per call, `make dev`'s "
    "concurrency 4: the last turn started 49 s after the first"
)
SESSION_POLL, SANDBOX_POLL = 2.0, 0.25
FINAL_STATUSES = ("waiting", "finished", "failed", "cancelled")
RUNTIME_KINDS = (
    "assistant_text_delta", "assistant_text", "tool_call", "tool_result", "file_changed",
    "error", "turn_finished",
)  # fmt: skip
SCRIPT = [
    {
        "text": "I'll run a short command.",
        "tool_calls": [{"name": "run_command", "input": {"command": "sleep 1"}}],
    },
    {"text": "Done: the command ran for a second."},
]

# Forced, not defaulted: an inherited test or dev environment must never leak in. Every
# other QUOR_ setting is dropped, so the stack runs with `make dev`'s defaults.
for _name in [n for n in os.environ if n.startswith("QUOR_")]:
    del os.environ[_name]
os.environ.update(
    {
        "DJANGO_SETTINGS_MODULE": "quor.settings",
        "QUOR_DEBUG": "1",
        "QUOR_DEPLOYMENT": DEPLOYMENT,
        "QUOR_SANDBOX_SUBNET": SUBNET,
        "QUOR_EGRESS_PROXY_PORT": str(PROXY_PORT),
        "QUOR_EGRESS_PRIVATE_ALLOWLIST": f"127.0.0.1:{MODEL_PORT}",
        "DATABASE_URL": f"postgresql:///{DATABASE}",
        "REDIS_URL": REDIS_URL,
        "QUOR_SANDBOX_API_URL": BASE,
        "QUOR_PUBLIC_URL": BASE,
        "QUOR_WEBAPP_BASE_URL": "http://localhost:32001",  # not started
        "QUOR_WEBAPP_PROXY_BIND": "127.0.0.1:32001",
        "QUOR_EGRESS_CA_DIR": str(WORK / "egress-ca"),
        "QUOR_FILE_STORE_DIR": str(WORK / "files"),
        "PYTHONUNBUFFERED": "1",
    }
)


# --- the API, as a member calls it -------------------------------------------------------


def api(method: str, path: str, token: str, body=None, timeout: float = 60):
    """(HTTP status, parsed JSON or text) of one call with the member's API token."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(  # noqa: S310  (our own daphne)
        BASE + path,
        data=data,
        method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    except OSError as exc:
        return 0, f"{type(exc).__name__}: {exc}"
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")[:300]


def event_time(event: dict) -> float:
    return datetime.fromisoformat(event["created_at"]).timestamp()


def session_events(token: str, session_id: str) -> list[dict]:
    events, after = [], 0
    while True:
        status, page = api("GET", f"/api/v1/sessions/{session_id}/events/?after={after}", token)
        if status != 200:
            raise RuntimeError(f"events of {session_id}: HTTP {status} {page}")
        events += page["results"]
        if not page["next"] or not page["results"]:
            return events
        after = page["results"][-1]["seq"]


# --- sleeps and wakes ----------------------------------------------------------------------


def wait_for_state(token: str, wanted: str, started: float, timeout: float) -> dict:
    """Polls the owner's GET /api/v1/sandbox/ until `wanted`; the seconds since `started`."""
    states = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, sandbox = api("GET", "/api/v1/sandbox/", token)
        state = sandbox.get("state") if status == 200 else f"HTTP {status}"
        if not states or states[-1] != state:
            states.append(state)
        if state == wanted:
            return {"seconds": time.time() - started, "states": states, "id": sandbox["id"]}
        if state in ("failed", "unrestorable"):
            return {"seconds": None, "states": states, "error": sandbox.get("failure_reason")}
        time.sleep(SANDBOX_POLL)
    return {"seconds": None, "states": states, "error": f"not {wanted} within {timeout:.0f} s"}


def wake(token: str, timeout: float = 600) -> dict:
    """POST /api/v1/sandbox/ (ensure_sandbox on the sandboxes queue) → `running`."""
    started = time.time()
    status, body = api("POST", "/api/v1/sandbox/", token, {})
    if status != 202:
        return {"seconds": None, "states": [], "error": f"POST /api/v1/sandbox/: {status} {body}"}
    result = wait_for_state(token, "running", started, timeout)
    result["sent_at"] = started
    return result


def put_to_sleep(token: str, sandbox_id: str, timeout: float = 600) -> dict:
    """`sandboxes.tasks.sleep_sandbox` on the sandboxes queue → `sleeping`. The sandbox's
    last activity is set back first: the task sleeps idle sandboxes only (what beat's
    `sleep_idle_sandboxes` would send after QUOR_SANDBOX_IDLE_SECONDS of quiet)."""
    from django.conf import settings
    from django.db import connection
    from django.utils import timezone

    from quor.celery import app
    from sandboxes.models import Sandbox

    quiet = timedelta(seconds=settings.QUOR_SANDBOX_IDLE_SECONDS + 60)
    Sandbox.objects.filter(pk=sandbox_id).update(last_activity_at=timezone.now() - quiet)
    connection.close()  # this thread's
    started = time.time()
    app.send_task("sandboxes.tasks.sleep_sandbox", args=[sandbox_id], queue="sandboxes")
    result = wait_for_state(token, "sleeping", started, timeout)
    result["sent_at"] = started
    return result


def in_threads(calls: dict) -> dict:
    """Runs {label: (function, args)} at once; {label: result}."""
    results = {}

    def run(label, function, args):
        try:
            results[label] = function(*args)
        except Exception as exc:  # reported as a missing figure
            results[label] = {"seconds": None, "states": [], "error": repr(exc)}

    threads = [
        threading.Thread(target=run, args=(label, function, args))
        for label, (function, args) in calls.items()
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


# --- the model ------------------------------------------------------------------------------


class Arrivals(list):
    """The scripted server's request log, with the arrival time of each request."""

    def append(self, request):
        request["at"] = time.time()
        super().append(request)


def start_model(model_seconds: float):
    from sandboxes.scripted_model import ScriptedModelServer

    server = ScriptedModelServer("127.0.0.1", MODEL_PORT)
    server.script = SCRIPT
    server.stall_seconds = model_seconds
    server.requests = Arrivals()
    return server


def first_model_requests(server) -> dict[int, float]:
    """Turn number → arrival of its agent's first model request (the prompt names it)."""
    first = {}
    for request in list(server.requests):
        found = re.search(r"bench-turn-(\d+)\b", json.dumps(request["body"]))
        if found:
            first.setdefault(int(found.group(1)), request["at"])
    return first


def peak_in_flight(server, model_seconds: float) -> int:
    """Most model requests in flight at once, each counted for `model_seconds` after its
    arrival (the server answers after that stall, in milliseconds)."""
    arrivals = sorted(request["at"] for request in server.requests)
    return max(
        (sum(1 for other in arrivals if at - model_seconds < other <= at) for at in arrivals),
        default=0,
    )


# --- set-up -----------------------------------------------------------------------------------


def empty_redis_db() -> None:
    """Tasks and channel-layer keys an interrupted run left in the bench's Redis db."""
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    client.close()


def make_members(users: int) -> tuple[str, list[str], dict[str, str]]:
    """The bench's organization, its scripted model provider, and new members with API
    tokens: one per turn, and three whose sandboxes sleep and wake. The members of an
    earlier run go first (sessions, then users: their sandbox rows and snapshots)."""
    from quor import services as quor_services
    from quor.models import ModelProvider, Organization, User
    from quor.selectors import make_model_id
    from sandboxes.models import Session

    organization = Organization.objects.filter(slug=ORG_SLUG).first()
    if organization is None:
        organization = quor_services.organization_create(slug=ORG_SLUG, name="Turns bench")
    earlier = User.objects.filter(membership__organization=organization)
    Session.objects.filter(owner__in=earlier).delete()
    earlier.delete()
    ModelProvider.objects.filter(organization=organization).delete()
    provider = quor_services.model_provider_create(
        organization=organization,
        kind=ModelProvider.Kind.ANTHROPIC,
        display_name="Bench scripted model",
        base_url=f"http://127.0.0.1:{MODEL_PORT}",
        api_key="bench-scripted-model-needs-no-key",
        model_names=[MODEL_NAME],
    )

    def member(name):
        user = quor_services.member_create(
            email=f"turns-{name}@bench.test", organization=organization
        )
        return quor_services.api_token_create(user=user, name="bench")[1]

    turns = [member(f"user{i:02d}") for i in range(users)]
    extra = {name: member(name) for name in ("wake-early", "wake-late", "sleep")}
    return make_model_id(provider.pk, MODEL_NAME), turns, extra


def build_image() -> None:
    started = time.monotonic()
    subprocess.run([str(ROOT / "tools" / "build-sandbox-image"), "--if-missing"], check=True)  # noqa: S603
    print(f"  sandbox image checked in {time.monotonic() - started:.1f} s", flush=True)


def prepare(*other_ports: int) -> None:
    """Before the stack starts (this bench's and bench/load.py's): its ports free, the
    sandbox image, the database migrated, Redis emptied, what an interrupted run left in
    Docker removed."""
    for port in (WEB_PORT, PROXY_PORT, MODEL_PORT, *other_ports):
        if not port_free(port):
            raise SystemExit(f"port {port} is in use here: another run?")
    WORK.mkdir(parents=True, exist_ok=True)
    build_image()
    ensure_database(DATABASE)
    empty_redis_db()

    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    print("  " + remove_network(), flush=True)


def tear_down(stack, server) -> None:
    """Stops the stack and the model, and removes the sandboxes and the Docker network."""
    stack.stop()
    server.close()
    with contextlib.suppress(Exception):
        print("  " + remove_network(), flush=True)


def verdict(passed: bool, began: float) -> int:
    print(f"{'PASS' if passed else 'FAIL'} in {time.monotonic() - began:.0f} s")
    return 0 if passed else 1


class Stack:
    """The processes of `tools/run-dev` but beat, the webapp proxy and the demo model."""

    def __init__(self):
        bin_dir = Path(sys.executable).parent
        self.argvs = {
            "web": [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(WEB_PORT),
                    "quor.asgi:application"],
            "worker": [str(bin_dir / "celery"), "-A", "quor", "worker",
                       "-Q", "default,sandboxes,agents", "--concurrency", "4",
                       "--loglevel", "INFO"],
            "proxy": [sys.executable, "manage.py", "run_egress_proxy"],
        }  # fmt: skip
        self.processes = {}

    def log(self, name: str) -> Path:
        return LOGS / f"{name}.log"

    def start(self) -> None:
        started = time.time()
        for name, argv in self.argvs.items():
            self.processes[name] = start_process_group(argv, self.log(name), cwd=ROOT)
        self._wait("web", lambda: _healthy())
        self._wait("worker", lambda: " ready." in self.log("worker").read_text(errors="replace"))
        self._wait("proxy", lambda: port_open(GATEWAY, PROXY_PORT) and _proxy_ready(started))

    def _wait(self, name, check, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if self.processes[name].poll() is not None or time.monotonic() > deadline:
                tail = self.log(name).read_text(errors="replace")[-3000:]
                raise SystemExit(f"{name} did not start; the end of {self.log(name)}:\n{tail}")
            time.sleep(0.2)

    def stop(self) -> None:
        for process in self.processes.values():
            stop_process_group(process)


def _healthy() -> bool:
    try:
        with urllib.request.urlopen(f"{BASE}/healthz", timeout=1):  # noqa: S310
            return True
    except OSError:
        return False


def _proxy_ready(since: float) -> bool:
    from egress import readiness

    state = readiness.readiness()
    return bool(state and state["at"] >= since)


class ConnectionPeak:
    """The most connections to the bench's database at once, sampled every 0.5 s."""

    def __init__(self):
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self):
        import psycopg

        query = "SELECT count(*) FROM pg_stat_activity WHERE datname = %s"
        with psycopg.connect("dbname=postgres", autocommit=True) as connection:
            while not self._stop.wait(0.5):
                (count,) = connection.execute(query, [DATABASE]).fetchone()
                self.peak = max(self.peak, count)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)


class DockerEvents:
    """The Docker Engine's container events of the bench's deployment (`docker events`),
    while the burst runs: when each sandbox's container was created and started, and when
    the turn's commands were started in it (`exec_create`)."""

    def __init__(self):
        argv = ["docker", "events", "--format", "{{json .}}", "--filter", "type=container",
                "--filter", f"label=org.quor.deployment={DEPLOYMENT}"]  # fmt: skip
        self.log = LOGS / "docker-events.log"
        self.process = start_process_group(argv, self.log)
        time.sleep(0.5)  # subscribed before the burst's first container

    def stop(self) -> None:
        time.sleep(1)  # events of the last moment
        stop_process_group(self.process)

    def by_sandbox(self) -> dict[str, list[tuple[float, str]]]:
        found = {}
        for line in self.log.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError, KeyError):
                event = json.loads(line)
                sandbox_id = event["Actor"]["Attributes"]["org.quor.sandbox-id"]
                found.setdefault(sandbox_id, []).append((event["timeNano"] / 1e9, event["Action"]))
        return found


# Steps of a turn in its new sandbox, from the Docker events: (label, the event's action
# is this or, for an `exec_create: <command>`, its command contains this, and whether the
# first or the last such event counts). The commands Quor runs in the sandbox (the
# firewall probe, the session directory's `mkdir`, the agent's start) go through its exec
# channel since issue 19, so Docker no longer sees them.
DOCKER_STEPS = [
    ("container created", "create", "first"),
    ("container started", "start", "first"),
]


def docker_step(events: list[tuple[float, str]], action: str, which: str) -> float | None:
    def matches(name):
        return name == action or (name.startswith("exec_create:") and action in name)

    times = sorted(at for at, name in events if matches(name))
    return (times[0] if which == "first" else times[-1]) if times else None


# --- the burst --------------------------------------------------------------------------------


def burst(args, model_id, tokens: list[str], extra: dict[str, str], sandbox_ids: dict) -> tuple:
    """All members POST a session at once (and the early wake goes with them); the
    late wake and the sleep go once every turn has started. Returns the turns' rows and
    the sleep/wake results."""
    count = len(tokens)
    rows = [{"index": i, "token": token} for i, token in enumerate(tokens)]
    barrier = threading.Barrier(count + 1)
    results = {}

    def post(row):
        barrier.wait()
        row["posted"] = time.time()
        prompt = f"bench-turn-{row['index']}: run `sleep 1`, then say that you are done."
        status, body = api(
            "POST", "/api/v1/sessions/", row["token"], {"prompt": prompt, "model": model_id}
        )
        row["answered"] = time.time()
        if status == 201:
            row["id"] = body["id"]
        else:
            row["error"] = f"POST /api/v1/sessions/: HTTP {status} {body}"

    def early_wake():
        barrier.wait()
        results["wake, sent with the burst"] = wake(extra["wake-early"])

    threads = [threading.Thread(target=post, args=(row,)) for row in rows]
    threads.append(threading.Thread(target=early_wake))
    for thread in threads:
        thread.start()
    for thread in threads[:-1]:
        thread.join()

    all_started = threading.Event()
    deadline = time.monotonic() + args.timeout
    watching = [row for row in rows if "id" in row]

    def watch():
        while watching and time.monotonic() < deadline:
            for row in list(watching):
                status, session = api("GET", f"/api/v1/sessions/{row['id']}/", row["token"])
                if status != 200:
                    continue
                if session["status"] != "pending":
                    row.setdefault("seen_started", time.time())
                if session["status"] in FINAL_STATUSES:
                    row["final"] = session["status"]
                    watching.remove(row)
            if all("seen_started" in row for row in rows if "id" in row):
                all_started.set()
            time.sleep(SESSION_POLL)
        all_started.set()  # a turn that never started: the late sleep/wake go anyway

    watcher = threading.Thread(target=watch)
    watcher.start()
    all_started.wait()
    results["all_started_seen"] = time.time()
    late = {
        "wake, sent once every turn had started": (wake, (extra["wake-late"],)),
        "sleep, sent once every turn had started": (
            put_to_sleep,
            (extra["sleep"], sandbox_ids["sleep"]),
        ),
    }
    results.update(in_threads(late))
    watcher.join()
    threads[-1].join()
    return rows, results


def before_burst(extra: dict[str, str]) -> tuple[dict, dict]:
    """On the idle stack: the three extra sandboxes created at once, two put to sleep at
    once, one woken and put to sleep again. Leaves "wake-early" and "wake-late" sleeping,
    "sleep" running. Returns the times and the sandboxes' ids."""
    results, ids = {}, {}
    created = in_threads({name: (wake, (token,)) for name, token in extra.items()})
    for name, result in created.items():
        if result["seconds"] is None:
            raise SystemExit(f"the {name} member's sandbox did not start: {result}")
        ids[name] = result["id"]
    results["create (3 at once)"] = [r["seconds"] for r in created.values()]
    slept = in_threads(
        {name: (put_to_sleep, (extra[name], ids[name])) for name in ("wake-early", "wake-late")}
    )
    woken = wake(extra["wake-early"])
    again = put_to_sleep(extra["wake-early"], ids["wake-early"])
    for label, result in [*slept.items(), ("wake", woken), ("sleep again", again)]:
        if result["seconds"] is None:
            raise SystemExit(f"before the burst, {label} failed: {result}")
    results["sleep (2 at once, then 1)"] = [
        *(r["seconds"] for r in slept.values()),
        again["seconds"],
    ]
    results["wake (alone)"] = [woken["seconds"]]
    return results, ids


# --- figures ------------------------------------------------------------------------------------


def turn_figures(rows: list[dict], server, docker_events: dict) -> None:
    """Adds, per turn, the seconds from its POST to each step."""
    first_request = first_model_requests(server)
    for row in rows:
        if "id" not in row:
            continue
        status, sandbox = api("GET", "/api/v1/sandbox/", row["token"])
        events_in_sandbox = docker_events.get(sandbox.get("id") if status == 200 else "", [])
        row["steps"] = {}
        for label, action, which in DOCKER_STEPS:
            at = docker_step(events_in_sandbox, action, which)
            row["steps"][label] = None if at is None else at - row["posted"]
        events = session_events(row["token"], row["id"])
        row["kinds"] = [event["kind"] for event in events]
        started = next((e for e in events if e["kind"] == "session_started"), None)
        agent = next((e for e in events if e["kind"] in RUNTIME_KINDS), None)
        done = next((e for e in events if e["kind"] in ("turn_finished", "error")), None)
        posted = row["posted"]
        row["response"] = row["answered"] - posted
        row["started"] = started and event_time(started) - posted
        at = first_request.get(row["index"])
        row["model"] = None if at is None else at - posted
        row["agent"] = agent and event_time(agent) - posted
        row["finished"] = done and event_time(done) - posted
        row["ok"] = bool(done and done["kind"] == "turn_finished" and row.get("final") == "waiting")
        if done and done["kind"] == "error":
            row["error"] = done["payload"].get("message", done["payload"])


TASK_LINE = re.compile(
    r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): [^\]]*\] "
    r"Task sandboxes\.tasks\.(\w+)\[[^\]]+\] succeeded in ([0-9.]+)s",
    re.MULTILINE,
)
PROBLEM = re.compile(r"\b(WARNING|ERROR|CRITICAL|Traceback)\b")


def worker_tasks(log: Path) -> list[dict]:
    """The worker's finished tasks: name, end (its log line's time, this host's clock)
    and run time."""
    tasks = []
    for stamp, name, run in TASK_LINE.findall(log.read_text(errors="replace")):
        ended = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
        tasks.append({"name": name, "ended": ended, "run": float(run)})
    return tasks


def split_wait(result: dict, tasks: list[dict], name: str) -> str:
    """How much of a timed sleep or wake its task waited in the queue and how long it
    ran: the `name` task that ended nearest to the state change seen by the poll."""
    if result.get("seconds") is None:
        return ""
    seen = result["sent_at"] + result["seconds"]
    candidates = [t for t in tasks if t["name"] == name and t["ended"] <= seen + 0.5]
    if not candidates:
        return ""
    task = min(candidates, key=lambda t: abs(seen - t["ended"]))
    waited = task["ended"] - task["run"] - result["sent_at"]
    return f" (queued {waited:.1f} s, ran {task['run']:.1f} s)"


def problems(log: Path) -> list[tuple[str, int]]:
    """Distinct WARNING+ lines (timestamps and ids blanked), with their counts."""
    found = {}
    for line in log.read_text(errors="replace").splitlines():
        if PROBLEM.search(line):
            key = re.sub(r"^\[[^\]]*\]\s*", "", line)
            key = re.sub(r"[0-9a-f]{8}-[0-9a-f-]{27}", "<id>", key)[:300]
            found[key] = found.get(key, 0) + 1
    return sorted(found.items(), key=lambda item: -item[1])


def first_median_last(values) -> tuple[str, str, str]:
    values = sorted(v for v in values if v is not None)
    if not values:
        return "—", "—", "—"
    return tuple(f"{v:.1f}" for v in (values[0], statistics.median(values), values[-1]))


def spread(values) -> str:
    values = list(values)
    return " / ".join(first_median_last(values)) if values else "—"


def seconds(value) -> str:
    return "—" if value is None else f"{value:.1f} s"


def report(args, rows, results, before, server, stack, burst_info) -> bool:
    count = len(rows)
    ok = sum(1 for row in rows if row.get("ok"))
    print()
    print(
        f"{count} members started a session at once; model {args.model_seconds:g} s per "
        f"call, 2 calls per turn (a `run_command` of `sleep 1` between them); one worker "
        f"`-Q default,sandboxes,agents --concurrency 4`; {os.cpu_count()} CPUs"
    )
    print()
    print("| from the start of its POST to | first | median | last |")
    print("| --- | --- | --- | --- |")
    for label, key in [
        ("its 201", "response"),
        ("`session_started` (the turn starts)", "started"),
        ("the agent's first model request (running in its sandbox)", "model"),
        ("the agent's first event", "agent"),
        ("`turn_finished`", "finished"),
    ]:
        first, median, last = first_median_last(row.get(key) for row in rows)
        print(f"| {label} | {first} | {median} | {last} |")
    print()
    print("Where a turn's time goes, step by step (seconds from the previous step; the sandbox's")
    print("steps from the Docker Engine's events)")
    print("| step | min | median | max |")
    print("| --- | --- | --- | --- |")
    chain = [
        ("POST → `session_started` (queued for a worker process)", "started"),
        *((f"→ {label}", label) for label, _, _ in DOCKER_STEPS),
        ("→ the agent's first model request", "model"),
        ("→ the agent's first event (the model's answer)", "agent"),
        ("→ `turn_finished` (a command, a second model call)", "finished"),
    ]

    def at(row, key):
        return row.get("steps", {}).get(key) if key not in row else row[key]

    previous = None
    for label, key in chain:
        steps = []
        for row in rows:
            here, before_here = at(row, key), (0.0 if previous is None else at(row, previous))
            steps.append(None if here is None or before_here is None else here - before_here)
        print(f"| {label} | {' | '.join(first_median_last(steps))} |")
        previous = key
    starts = sorted(row["started"] for row in rows if row.get("started") is not None)
    agents = sorted(row["model"] for row in rows if row.get("model") is not None)
    start_spread = starts[-1] - starts[0] if len(starts) == count else None
    agent_spread = agents[-1] - agents[0] if len(agents) == count else None
    print()
    print(
        f"Turns finished OK (`turn_finished`, session waiting): {ok} of {count}. Last turn "
        f"started {seconds(start_spread)} after the first; last agent running "
        f"{seconds(agent_spread)} after the first. Model calls in flight at once, at the "
        f"peak: {peak_in_flight(server, args.model_seconds)} ({len(server.requests)} calls "
        f"in all). Host busy during the burst: {burst_info['busy']:.0%} of "
        f"{os.cpu_count()} cores; peak connections to the database: {burst_info['peak_db']}."
    )
    print(f"Anchor, {ANCHOR}.")
    print()
    print("Sleep and wake through the sandboxes queue (the same worker), seconds")
    print("| operation | idle stack, before the burst | during the burst |")
    print("| --- | --- | --- |")
    last_start = max(
        (row["posted"] + row["started"] for row in rows if row.get("started") is not None),
        default=None,
    )
    late = results.get("wake, sent once every turn had started", {})
    after = (
        "—"
        if last_start is None or "sent_at" not in late
        else (f"{late['sent_at'] - last_start:.1f} s")
    )
    during = {
        "wake": [
            ("sent with the burst", results.get("wake, sent with the burst", {})),
            (f"sent once every turn had started ({after} after the last)", late),
        ],
        "sleep": [
            ("sent once every turn had started", results.get(
                "sleep, sent once every turn had started", {})),
        ],
    }  # fmt: skip
    idle = {
        "create": before["create (3 at once)"],
        "wake": before["wake (alone)"],
        "sleep": before["sleep (2 at once, then 1)"],
    }
    print(f"| create (POST /api/v1/sandbox/ → running, 3 at once) | {spread(idle['create'])} | — |")
    tasks = worker_tasks(stack.log("worker"))
    for operation, task in (("wake", "ensure_sandbox"), ("sleep", "sleep_sandbox")):
        cells = "; ".join(
            f"{label}: {seconds(result.get('seconds'))}{split_wait(result, tasks, task)}"
            for label, result in during[operation]
        )
        print(f"| {operation} | {spread(idle[operation])} | {cells} |")
    print("(idle column: first / median / last of its samples)")
    print()
    print("Worker task run times from its log, whole run, seconds (min / median / max; count)")
    for name in sorted({task["name"] for task in tasks}):
        values = [task["run"] for task in tasks if task["name"] == name]
        print(f"  {name}: {spread(values)} ({len(values)})")
    print()
    print("Per turn, seconds after its POST (started / agent's first model request / first event "
          "/ finished, outcome):")  # fmt: skip
    for row in rows:
        outcome = "ok" if row.get("ok") else f"NOT OK: {row.get('final')} {row.get('error', '')}"
        print(
            f"  turn {row['index']:2d}: {seconds(row.get('started'))} / "
            f"{seconds(row.get('model'))} / {seconds(row.get('agent'))} / "
            f"{seconds(row.get('finished'))}  {outcome}"
        )
    print()
    for name in stack.argvs:
        lines = problems(stack.log(name))
        if lines:
            print(f"Lines at WARNING and above in {stack.log(name)} ({len(lines)} distinct):")
            for line, number in lines[:15]:
                print(f"  {number:3d}x {line}")
    figures = [
        start_spread,
        agent_spread,
        *(row.get(key) for row in rows for key in ("started", "model", "agent", "finished")),
        *(step for row in rows for step in row.get("steps", {None: None}).values()),
        *(result.get("seconds") for pairs in during.values() for _, result in pairs),
    ]
    missing = [f for f in figures if f is None]
    if missing:
        print(f"MISSING: {len(missing)} figures (see the rows above)")
    return ok == count and not missing


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=20, help="members starting a session")
    parser.add_argument("--model-seconds", type=float, default=15, help="per model call")
    parser.add_argument("--quick", action="store_true", help="4 users, 2 s model calls")
    parser.add_argument("--timeout", type=float, default=900, help="for the burst, seconds")
    args = parser.parse_args()
    if args.quick:
        args.users, args.model_seconds = 4, 2
    # SIGTERM (and SIGINT even when a shell started us in the background, ignoring it)
    # end the run through the `finally` below, which removes what the bench made.
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda signum, frame: sys.exit(128 + signum))
    began = time.monotonic()
    load = os.getloadavg()
    print(
        f"{datetime.now().astimezone():%Y-%m-%d %H:%M %Z}, {os.cpu_count()} CPUs, load average "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {args.users} users, model "
        f"{args.model_seconds:g} s per call",
        flush=True,
    )
    prepare()
    model_id, tokens, extra = make_members(args.users)
    server = start_model(args.model_seconds)
    stack = Stack()
    passed = False
    try:
        stack.start()
        print(f"  stack up after {time.monotonic() - began:.0f} s; logs in {LOGS}", flush=True)
        before, sandbox_ids = before_burst(extra)
        print(f"  before the burst: {before}", flush=True)
        server.requests.clear()
        cpu_before = host_cpu_times()
        docker_events = DockerEvents()
        try:
            with ConnectionPeak() as peak:
                rows, results = burst(args, model_id, tokens, extra, sandbox_ids)
        finally:
            docker_events.stop()
        cpu_after = host_cpu_times()
        busy = (cpu_after[0] - cpu_before[0]) / max(1, cpu_after[1] - cpu_before[1])
        turn_figures(rows, server, docker_events.by_sandbox())
        info = {"busy": busy, "peak_db": peak.peak}
        passed = report(args, rows, results, before, server, stack, info)
    finally:
        tear_down(stack, server)
    return verdict(passed, began)


if __name__ == "__main__":
    sys.exit(main())
