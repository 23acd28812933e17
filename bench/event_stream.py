#!/usr/bin/env python3
"""Event stream latency: from the agent runtime's report to the session's WebSocket viewers.

    .venv/bin/python bench/event_stream.py      (about 1.5 minutes; --help for sizes)

Starts a real web process (`python -m daphne` on 127.0.0.1:28100) and a Celery worker for
the `agents` queue, on their own database (`quor_bench_events`, created and migrated if
needed, its connections capped at CONNECTION_LIMIT) and Redis db 5, deployment
"bench-events". No container: the sandbox row is marked running and holds a runtime
credential; the worker's sandbox backend is a stub (StubBackend).

The runtime is simulated by a separate process: it POSTs assistant_text_delta events to
/api/v1/runtime/sessions/<id>/events/ with the sandbox credential and the session's turn
(--without-turn: none, so that Django's view stores them, the way before), a new connection per
POST and one POST in flight per session (as the runtime's urllib and send lock do), each
event carrying its send time (`time.time_ns()`). WebSocket viewers (aiohttp, session
cookie and Origin as a browser sends them) note when each event arrives; latency is
arrival - send. Scenarios: one session and one viewer, flat out, batches of 20 events
and then 1 event per POST; 20 sessions with 2 viewers each, 1 event per POST every
500 ms, every 100 ms (the runtime's delta flush interval), then batches of 20 flat out.
After each, every viewer must have received exactly the seqs the database holds for its
session (the truth), once each, in order. Last, POST /api/v1/sessions/ is timed to its
`user_message` and `session_started` on a WebSocket opened with the id it returns.
"""

import argparse
import asyncio
import concurrent.futures
import json
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from datetime import datetime
from pathlib import Path

from common import port_free

ROOT = Path(__file__).resolve().parent.parent
PORT = 28100
BASE = f"http://127.0.0.1:{PORT}"
ORIGIN = BASE
DATABASE = "quor_bench_events"
ENVIRONMENT = {
    "DJANGO_SETTINGS_MODULE": "quor.settings",
    "DATABASE_URL": f"postgresql:///{DATABASE}",
    "REDIS_URL": "redis://127.0.0.1:6379/5",
    # production mode: DEBUG's cursor wrapper alone took a tenth of the web process's CPU
    "QUOR_ENCRYPTION_KEY": "bench-only-encryption-key",
    "QUOR_SECRET_KEY": "bench-only-secret-key-0123456789-0123456789-0123456789",
    "QUOR_DEPLOYMENT": "bench-events",
    "PYTHONUNBUFFERED": "1",
}
BATCH = 20  # events per POST in the batched runs
PACE = 0.1  # the runtime posts buffered text deltas at most every 0.1 s (its FLUSH_INTERVAL)
DELIVERY_WAIT = 10  # seconds a viewer may lag behind the last POST
CONNECTION_LIMIT = 40  # of this database, so that a run cannot starve the shared server
TEXT = "The quick brown fox jumps over the lazy dog. "  # one delta's text, 45 characters
TURN = 1  # the seq of each session's `session_started`: its reports say so
TARGET_MEDIAN_MS, TARGET_P99_MS, TARGET_RATE = 50, 250, 500
TARGET_FIRST_EVENT_S = 1.0


# --- the simulated runtime (runs in its own process: no Django there) ------------------


def run_runtime(
    credential: str, session_ids: list, posts: int, batch: int, pace: float, turn: int | None
) -> dict:
    return asyncio.run(_runtime(credential, session_ids, posts, batch, pace, turn))


async def _runtime(credential, session_ids, posts, batch, pace, turn) -> dict:
    """One sequence of POSTs per session, one POST in flight at a time (the runtime's
    send lock); with `pace`, a POST starts at most every `pace` seconds (its flush), the
    sessions' first POSTs spread over one `pace` (real agents do not report in step). Each
    says its turn, as the runtime does, unless `turn` is None (an agent of before turns,
    whose reports Django's view stores: the path every report took before)."""
    import aiohttp

    cpu = time.process_time()
    headers = {"Authorization": f"Bearer {credential}"}
    # A new connection per POST, as the runtime's urllib does.
    connector = aiohttp.TCPConnector(force_close=True, limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:

        async def one_session(position, session_id):
            url = f"{BASE}/api/v1/runtime/sessions/{session_id}/events/"
            durations, failures = [], []
            # Agents are not in step: paced sessions start spread over one interval.
            await asyncio.sleep(pace * position / len(session_ids))
            for number in range(posts):
                sent = time.time_ns()
                events = [
                    {
                        "kind": "assistant_text_delta",
                        "payload": {"text": TEXT, "t": sent, "n": number * batch + i},
                    }
                    for i in range(batch)
                ]
                report = {"events": events, **({"turn": turn} if turn else {})}
                async with http.post(url, json=report, headers=headers) as response:
                    body = await response.read()
                if response.status != 200:
                    failures.append(f"HTTP {response.status}: {error_title(body)}")
                took = (time.time_ns() - sent) / 1e9
                durations.append(took * 1000)
                if pace and took < pace:
                    await asyncio.sleep(pace - took)
            return durations, failures

        started = time.time_ns()
        results = await asyncio.gather(*(one_session(*s) for s in enumerate(session_ids)))
    return {
        "started": started,
        "durations": [d for durations, _ in results for d in durations],
        "failures": [f for _, failures in results for f in failures],
        "cpu": time.process_time() - cpu,
    }


def error_title(body: bytes) -> str:
    """An HTML error page's title, or the body's start."""
    text = body.decode(errors="replace")
    if "<title>" in text:
        text = text.split("<title>", 1)[1].split("</title>", 1)[0]
    return " ".join(text.split()).split(" at /")[0][:160]


def warm_up() -> None:
    import aiohttp  # noqa: F401  (imported once, before the first measured run)


# --- the worker's sandbox backend ----------------------------------------------------------


class StubBackend:
    """The Celery worker's sandbox backend: "running", every command succeeds at once.
    `session_started` is recorded before a turn touches the sandbox, so the time to it
    does not depend on this; what follows it (workspace, agent) is not measured."""

    name = "bench-stub"

    def egress_proxy_address(self):
        return "10.233.0.1"

    def check_host_users(self):
        """The worker's start-up check of the Docker host (quor.checks): nothing here."""

    def image_ref(self, image):
        return ""

    def status(self, sandbox_id):
        from sandboxes.backends.base import RuntimeStatus

        return RuntimeStatus(exists=True, running=True, runtime_id="stub", image_ref="stub")

    def exec(self, sandbox_id, argv, **kwargs):
        from sandboxes.backends.base import ExecResult

        return ExecResult(0, b"", b"", False, False, False, 0.0)

    def write_file(self, sandbox_id, root, relpath, chunks, size):
        return {}


def worker_main() -> None:
    import django

    django.setup()
    from sandboxes import backends

    backends.BACKENDS["docker"] = "__main__.StubBackend"
    from quor.celery import app

    queue = ["-Q", "agents", "-n", "bench-events@%h", "--concurrency", "2"]
    quiet = ["--without-mingle", "--without-gossip", "--without-heartbeat"]
    app.worker_main(["worker", *queue, *quiet, "--loglevel", "INFO"])


# --- set-up ----------------------------------------------------------------------------------


def psql(query: str) -> str:
    return subprocess.run(  # noqa: S603
        ["psql", "-d", "postgres", "-tAc", query],  # noqa: S607
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def ensure_database() -> None:
    """Creates the database if missing, and caps its connections: the PostgreSQL server
    (100 connections) is shared with other work on this machine."""
    if psql(f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE}'") != "1":  # noqa: S608
        createdb = ["createdb", DATABASE]
        if os.geteuid() == 0:
            createdb = ["runuser", "-u", "postgres", "--", "createdb", "-O", "root", DATABASE]
        subprocess.run(createdb, check=True)  # noqa: S603
    psql(f"ALTER DATABASE {DATABASE} CONNECTION LIMIT {CONNECTION_LIMIT}")


def make_fixtures() -> dict:
    """An organization, a member with a running sandbox (and its runtime credential), a
    provider, an API token, a browser session cookie and the sessions to stream."""
    import secrets

    from django.test import Client

    from quor import services
    from sandboxes.models import Sandbox, Session, hash_token
    from sandboxes.sessions.events import session_events_append
    from tests import factories

    tag = secrets.token_hex(4)
    org = factories.make_org(slug=f"bench-events-{tag}", name=f"Bench events {tag}")
    user = factories.make_user(org, email=f"bench-events-{tag}@example.com")
    provider = factories.make_provider(org, model_names=["bench-model"])
    credential = secrets.token_urlsafe(32)
    factories.make_sandbox(
        user, state=Sandbox.State.RUNNING, runtime_credential_hash=hash_token(credential)
    )
    _, api_token = services.api_token_create(user=user, name="bench")
    client = Client()
    client.force_login(user)

    def new_sessions(count):
        """Running sessions whose turn began with seq TURN."""
        sessions = [
            factories.make_session(user, provider, status=Session.Status.RUNNING)
            for _ in range(count)
        ]
        for session in sessions:
            session_events_append(session=session, events=[("session_started", {})])
        return [str(session.pk) for session in sessions]

    return {
        "credential": credential,
        "api_token": api_token,
        "cookie": f"sessionid={client.cookies['sessionid'].value}",
        "model": f"{provider.pk}:bench-model",
        "new_sessions": new_sessions,
    }


def stored_seqs(session_ids: list[str]) -> dict[str, list[int]]:
    from sandboxes.models import AgentEvent

    seqs = {session_id: [] for session_id in session_ids}
    rows = AgentEvent.objects.filter(session_id__in=session_ids, seq__gt=TURN)
    rows = rows.order_by("session_id", "seq")
    for session_id, seq in rows.values_list("session_id", "seq"):
        seqs[str(session_id)].append(seq)
    return seqs


def start(argv: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(  # noqa: S603
        argv,
        cwd=ROOT,
        env={**os.environ, **ENVIRONMENT},
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def wait_for(check, what: str, log: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    tail = log.read_text(errors="replace")[-3000:]
    raise SystemExit(f"{what} did not start within {timeout:.0f} s; its log:\n{tail}")


def web_ready() -> bool:
    try:
        with urllib.request.urlopen(f"{BASE}/healthz", timeout=1):  # noqa: S310
            return True
    except OSError:
        return False


def stop(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


# --- resources: CPU per process, connections to the database ----------------------------------


def process_cpu(pid: int) -> float:
    """CPU seconds of a process (and its waited-for children), from /proc; 0 if gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    """The daphne processes of `manage.py serve_web` (none under a bare daphne)."""
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def pids_named(name: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "comm").read_text().strip() == name:
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


class Resources:
    """CPU over a run of the web process, of PostgreSQL and Redis (all their processes:
    both servers are shared with any other work on the machine) and of the bench's
    clients; and the peak number of connections to the bench's database."""

    def __init__(self, daphne_pid: int):
        self.daphne_pid = daphne_pid
        self.peak_connections = 0
        self._stop = threading.Event()

    def _count_connections(self):
        import psycopg

        query = "SELECT count(*) FROM pg_stat_activity WHERE datname = %s"
        with psycopg.connect("dbname=postgres", autocommit=True) as connection:
            while not self._stop.wait(0.1):
                (count,) = connection.execute(query, [DATABASE]).fetchone()
                self.peak_connections = max(self.peak_connections, count)

    def _cpu(self) -> dict[str, float]:
        return {
            "daphne": sum(map(process_cpu, [self.daphne_pid, *children(self.daphne_pid)])),
            # a process's figure includes its exited children: the postmaster's, the backends
            "postgres": sum(process_cpu(pid) for pid in pids_named("postgres")),
            "redis": sum(process_cpu(pid) for pid in pids_named("redis-server")),
            "driver": time.process_time(),
        }

    def __enter__(self):
        self.wall, self.busy, self.cpu = time.monotonic(), host_busy(), self._cpu()
        self._thread = threading.Thread(target=self._count_connections, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)
        self.wall = time.monotonic() - self.wall
        busy, total = host_busy()
        self.busy = (busy - self.busy[0]) / max(1, total - self.busy[1])
        self.cpu = {name: value - self.cpu[name] for name, value in self._cpu().items()}


def host_busy() -> tuple[int, int]:
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


# --- viewers and measuring -------------------------------------------------------------------


def ranges(numbers: list[int]) -> str:
    """1, 2, 3, 7 -> "1-3, 7"."""
    parts, start = [], None
    for i, number in enumerate(numbers):
        if start is None:
            start = number
        if i + 1 == len(numbers) or numbers[i + 1] != number + 1:
            parts.append(str(start) if start == number else f"{start}-{number}")
            start = None
    return ", ".join(parts) or "none"


def percentile(ordered: list[float], fraction: float) -> float:
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


async def connect_viewer(http, session_id: str, cookie: str, after: int = 0):
    return await http.ws_connect(
        f"ws://127.0.0.1:{PORT}/ws/sessions/{session_id}/?after={after}",
        headers={"Origin": ORIGIN, "Cookie": cookie},
        max_msg_size=0,
    )


async def receive_into(ws, got: list) -> None:
    """Appends (arrival time, raw message) until the socket closes or the task is
    cancelled; messages are parsed after the run, to keep this loop light."""
    import aiohttp

    while True:
        message = await ws.receive()
        arrived = time.time_ns()
        if message.type != aiohttp.WSMsgType.TEXT:
            return
        got.append((arrived, message.data))


async def stream_scenario(http, pool, fixtures, name, sessions, viewers_each, posts, batch, pace):
    """Viewers connect first; the runtime posts; then every viewer must receive exactly
    the seqs the database holds for its session (the truth), in order."""
    from asgiref.sync import sync_to_async

    session_ids = await sync_to_async(fixtures["new_sessions"])(sessions)
    viewers = [
        (session_id, await connect_viewer(http, session_id, fixtures["cookie"], TURN), [])
        for session_id in session_ids
        for _ in range(viewers_each)
    ]
    loop = asyncio.get_running_loop()
    with Resources(fixtures["daphne_pid"]) as used:
        receivers = [asyncio.ensure_future(receive_into(ws, got)) for _, ws, got in viewers]
        runtime = await loop.run_in_executor(
            pool, run_runtime, fixtures["credential"], session_ids, posts, batch, pace,
            fixtures["turn"],
        )  # fmt: skip
        truth = await sync_to_async(stored_seqs)(session_ids)
        deadline = time.monotonic() + DELIVERY_WAIT
        while time.monotonic() < deadline and any(
            len(got) < len(truth[session_id]) for session_id, _, got in viewers
        ):
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # anything extra (a duplicate) would show up now
    for receiver in receivers:
        receiver.cancel()
    for _, ws, _ in viewers:
        await ws.close()

    latencies, problems, last_arrival, undelivered = [], [], 0, 0
    for session_id, _, got in viewers:
        expected = truth[session_id]
        events = [(arrived, json.loads(raw)) for arrived, raw in got]
        seqs = [event["seq"] for _, event in events]
        numbers = [event["payload"]["n"] for _, event in events]
        if expected != list(range(TURN + 1, TURN + 1 + len(expected))):
            problems.append(
                f"session {session_id[:8]}: stored seqs are not {TURN + 1}..{TURN + len(expected)}"
            )
        if seqs != expected or numbers != sorted(numbers):
            missing = sorted(set(expected) - set(seqs))
            undelivered += len(missing)
            problems.append(
                f"session {session_id[:8]}: got {len(seqs)} of {len(expected)} stored events, "
                f"{len(missing)} missing ({ranges(missing)}), {len(seqs) - len(set(seqs))} "
                f"duplicated, in order: {seqs == sorted(seqs)}"
            )
        latencies += [(arrived - event["payload"]["t"]) / 1e6 for arrived, event in events]
        last_arrival = max([last_arrival] + [arrived for arrived, _ in events])
    stored = sum(len(seqs) for seqs in truth.values())
    elapsed = (last_arrival - runtime["started"]) / 1e9
    ordered = sorted(latencies) or [float("nan")]
    return {
        "name": name,
        "sessions": sessions,
        "viewers": len(viewers),
        "posts": posts * sessions,
        "refused": len(runtime["failures"]),
        "failures": runtime["failures"],
        "stored": stored,
        "median": statistics.median(ordered),
        "p99": percentile(ordered, 0.99),
        "max": ordered[-1],
        "rate": stored / elapsed if elapsed > 0 else 0.0,
        "post_median": statistics.median(runtime["durations"]),
        "problems": problems,
        "undelivered": undelivered,
        "cpu": {
            "daphne": used.cpu["daphne"] / used.wall,
            "postgres": used.cpu["postgres"] / used.wall,
            "redis": used.cpu["redis"] / used.wall,
            "clients": (used.cpu["driver"] + runtime["cpu"]) / used.wall,
        },
        "daphne_ms_per_post": used.cpu["daphne"] * 1000 / (posts * sessions),
        "host_busy": used.busy,
        "peak_connections": used.peak_connections,
    }


async def first_event_scenario(http, fixtures, runs: int) -> tuple[list[dict], list[str]]:
    """POST /api/v1/sessions/ as a client would, then open the session's WebSocket (the
    id comes with the response) and wait for `user_message` and `session_started`."""
    headers = {"Authorization": f"Bearer {fixtures['api_token']}"}
    rows, failures = [], []
    for number in range(runs):
        body = {"prompt": f"Benchmark prompt {number}", "model": fixtures["model"]}
        started = time.time_ns()
        async with http.post(f"{BASE}/api/v1/sessions/", json=body, headers=headers) as response:
            raw = await response.read()
        if response.status != 201:
            failures.append(f"POST /api/v1/sessions/: HTTP {response.status}: {error_title(raw)}")
            continue
        answered, created = time.time_ns(), json.loads(raw)
        ws = await connect_viewer(http, created["id"], fixtures["cookie"])
        opened, got = time.time_ns(), []
        receiver = asyncio.ensure_future(receive_into(ws, got))
        deadline = time.monotonic() + 10
        while len(got) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.001)
        receiver.cancel()
        await ws.close()
        arrivals = {}
        for arrived, raw in got:
            event = json.loads(raw)
            stored = datetime.fromisoformat(event["created_at"]).timestamp() * 1e9
            arrivals[event["kind"]] = (arrived, stored)
        if "user_message" not in arrivals:
            failures.append(f"session {created['id'][:8]}: no user_message on the WebSocket")
            continue
        begun = arrivals.get("session_started")
        rows.append(
            {
                "post": (answered - started) / 1e6,
                "ws_open": (opened - answered) / 1e6,
                "user_message": (arrivals["user_message"][0] - started) / 1e6,
                "started_stored": begun and (begun[1] - started) / 1e6,
                "session_started": begun and (begun[0] - started) / 1e6,
                "started_live": bool(begun and begun[1] > opened),
            }
        )
    return rows, failures


async def measure(args, fixtures, pool):
    import aiohttp

    async with aiohttp.ClientSession() as http:

        async def stream(name, sessions, viewers_each, posts, batch, pace=0.0):
            return await stream_scenario(
                http, pool, fixtures, name, sessions, viewers_each, posts, batch, pace
            )

        one = [
            await stream(f"1 session, batches of {BATCH}, flat out", 1, 1, args.posts, BATCH),
            await stream("1 session, 1 event per POST, flat out", 1, 1, args.posts_single, 1),
        ]
        first_events = await first_event_scenario(http, fixtures, args.first_event_runs)
        n, slow = args.sessions, 5 * PACE
        many = [  # lightest first: connections the web process leaves open carry over
            await stream(
                f"{n} sessions, 1 event per POST every {slow * 1000:.0f} ms", n, 2,
                args.posts_slow, 1, slow,
            ),
            await stream(
                f"{n} sessions, 1 event per POST every {PACE * 1000:.0f} ms", n, 2,
                args.posts_paced, 1, PACE,
            ),
            await stream(
                f"{n} sessions, batches of {BATCH}, flat out", n, 2, args.posts_concurrent, BATCH
            ),
        ]  # fmt: skip
    return one + many, first_events


# --- report ------------------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def print_stream(results: list[dict]) -> None:
    print(
        "| scenario | sessions x viewers | POSTs (refused) | events stored | median ms | p99 ms "
        "| max ms | events/s | POST median ms | delivered to every viewer |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        check = "all, once, in order"
        if r["problems"]:
            check = f"LOST {r['undelivered']} of {r['stored'] * r['viewers'] // r['sessions']}"
        print(
            f"| {r['name']} | {r['sessions']} x {r['viewers'] // r['sessions']} "
            f"| {r['posts']} ({r['refused']}) | {r['stored']} | {r['median']:.1f} "
            f"| {r['p99']:.1f} | {r['max']:.1f} | {r['rate']:.0f} | {r['post_median']:.1f} "
            f"| {check} |"
        )
    print(
        "\nWhere the CPU went, in shares of one core over each run (everything else: the "
        "kernel, the Celery worker, and any other work on the machine)"
    )
    print(
        "| scenario | web (daphne) | its CPU per POST | PostgreSQL | Redis "
        "| bench clients | everything else | host busy | peak DB connections |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        cpu = r["cpu"]
        rest = r["host_busy"] * (os.cpu_count() or 1) - sum(cpu.values())
        print(
            f"| {r['name']} | {cpu['daphne']:.0%} | {r['daphne_ms_per_post']:.1f} ms "
            f"| {cpu['postgres']:.0%} | {cpu['redis']:.0%} | {cpu['clients']:.0%} | {rest:.0%} "
            f"| {r['host_busy']:.0%} of {os.cpu_count()} cores | {r['peak_connections']} |"
        )
    for r in results:
        for problem in r["problems"][:5]:
            print(f"  {r['name']}: {problem}")
        reasons = {}
        for failure in r["failures"]:
            reasons[failure] = reasons.get(failure, 0) + 1
        for reason, count in reasons.items():
            print(f"  {r['name']}: {count} POSTs refused: {reason}")


def print_targets(results: list[dict]) -> None:
    def intact(r):
        if not r["problems"]:
            return "nothing lost, every seq once and in order"
        return f"LOST: {r['undelivered']} stored events never reached a viewer"

    batched = results[0]
    print(
        f"\nTargets, one session (batched): median < {TARGET_MEDIAN_MS} ms "
        f"{verdict(batched['median'] < TARGET_MEDIAN_MS)} ({batched['median']:.1f}); "
        f"p99 < {TARGET_P99_MS} ms {verdict(batched['p99'] < TARGET_P99_MS)} "
        f"({batched['p99']:.1f}); >= {TARGET_RATE} events/s "
        f"{verdict(batched['rate'] >= TARGET_RATE)} ({batched['rate']:.0f}); {intact(batched)}"
    )
    for r in results[1:]:
        print(
            f"  {r['name']}: median {verdict(r['median'] < TARGET_MEDIAN_MS)}, "
            f"p99 {verdict(r['p99'] < TARGET_P99_MS)}, {r['refused']} POSTs refused, "
            f"{intact(r)}"
        )


def print_first_event(rows: list[dict], failures: list[str]) -> None:
    def stats(key):
        values = sorted(row[key] for row in rows if row[key] is not None)
        if not values:
            return "—", "—", "—"
        return tuple(
            f"{v:.1f}" for v in (statistics.median(values), percentile(values, 0.95), values[-1])
        )

    print(
        "\nPOST /api/v1/sessions/ -> its first events on a WebSocket (sandbox already "
        "running): API + DB + WebSocket connect + backlog read; `session_started` through "
        "a real Celery worker (agents queue), stub sandbox backend"
    )
    print(f"| from the start of the POST to ({len(rows)} sessions) | median ms | p95 ms | max ms |")
    print("| --- | --- | --- | --- |")
    for label, key in [
        ("its 201 response", "post"),
        ("the WebSocket open (connected after the 201)", "ws_open"),
        ("`user_message` on the WebSocket", "user_message"),
        ("`session_started` stored by the worker", "started_stored"),
        ("`session_started` on the WebSocket", "session_started"),
    ]:
        median, p95, worst = stats(key)
        if key == "ws_open":
            label = "the WebSocket open, counted from the 201"
        print(f"| {label} | {median} | {p95} | {worst} |")
    live = sum(row["started_live"] for row in rows)
    print(
        f"`session_started` was published after the WebSocket opened (delivered live) for "
        f"{live} of {len(rows)} sessions, and came from the backlog for the others."
    )
    for failure in failures:
        print(f"  failed: {failure}")
    if not rows:
        print("Target: POST -> first event median < 1 s: MISSED (no session got through)")
        return
    median = statistics.median(row["user_message"] for row in rows)
    print(
        f"Target: POST -> first event median < {TARGET_FIRST_EVENT_S * 1000:.0f} ms: "
        f"{verdict(median < TARGET_FIRST_EVENT_S * 1000)} ({median:.1f} ms)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--posts", type=int, default=250, help="POSTs of 20, one session")
    parser.add_argument("--posts-single", type=int, default=500, help="POSTs of 1, one session")
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--posts-slow", type=int, default=12, help="per session, of 1")
    parser.add_argument("--posts-paced", type=int, default=30, help="per session, of 1")
    parser.add_argument("--posts-concurrent", type=int, default=25, help="per session, of 20")
    parser.add_argument("--first-event-runs", type=int, default=20)
    parser.add_argument(
        "--without-turn", action="store_true",
        help="reports without their turn: all stored by Django's view (the path before)",
    )  # fmt: skip
    parser.add_argument(
        "--web-processes", type=int, default=0,
        help="serve with `manage.py serve_web --processes N` (default: one bare daphne)",
    )  # fmt: skip
    args = parser.parse_args()
    os.environ.update(ENVIRONMENT)
    sys.path.insert(0, str(ROOT))
    if args.worker:
        worker_main()
        return

    import django

    ensure_database()
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    fixtures = make_fixtures()

    if not port_free(PORT):  # or the figures would be another web process's
        sys.exit(f"port {PORT} is taken: a web process left by an earlier run? Stop it first.")
    logs = Path(tempfile.mkdtemp(prefix="bench-events-"))
    if args.web_processes:
        web = ["manage.py", "serve_web", "--port", str(PORT)]
        web += ["--processes", str(args.web_processes)]
    else:
        web = ["-m", "daphne", "-b", "127.0.0.1", "-p", str(PORT), "quor.asgi:application"]
    daphne = start([sys.executable, *web], logs / "daphne.log")
    worker = start([sys.executable, __file__, "--worker"], logs / "worker.log")
    fixtures["daphne_pid"] = daphne.pid
    fixtures["turn"] = None if args.without_turn else TURN
    spawn = multiprocessing.get_context("spawn")
    pool = concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=spawn)
    try:
        pool.submit(warm_up).result()
        wait_for(web_ready, "daphne", logs / "daphne.log")
        wait_for(
            lambda: " ready." in (logs / "worker.log").read_text(errors="replace"),
            "the Celery worker",
            logs / "worker.log",
        )
        results, first_events = asyncio.run(measure(args, fixtures, pool))
    finally:
        pool.shutdown()
        stop(daphne)
        stop(worker)

    way = "without their turn (Django's view)" if args.without_turn else "with their turn"
    print(f"\n{os.cpu_count()} CPUs; reports {way}; daphne's and the worker's logs: {logs}\n")
    print("Delivery latency, runtime POST -> WebSocket viewer (send time in the event payload)")
    print_stream(results)
    log = (logs / "daphne.log").read_text(errors="replace")
    if "too many connections for database" in log:
        print(
            f"  The refused POSTs' cause, in daphne's log: FATAL: too many connections for "
            f'database "{DATABASE}" (its limit: {CONNECTION_LIMIT})'
        )
    print_targets(results)
    print_first_event(*first_events)


if __name__ == "__main__":
    main()
