#!/usr/bin/env python3
"""Approvals: App policy evaluation time, and decision-to-forwarded-request latency.

    .venv/bin/python bench/approvals.py [--calls 200000] [--requests 30] [--warmup 3]
        [--skip-policy] [--skip-latency] [--show-sql]

1. Policy evaluation (pure, in this process): `apps.policy.decide_app_request` over an
   `AppIndex` of 500 Apps with 50 actions each (distinct hosts, catalog-like path
   patterns: `{param}` segments, some final `/**`, some wildcard hosts and base paths),
   for a mix of requests (hits on actions, uncataloged paths on App hosts, hosts no App
   owns); each call timed with perf_counter_ns. Then the same with 5 Apps, and the
   500-App index with requests to 5 of its Apps (same work per call, warmer CPU caches).
   Also the time to build that index, and to load it from PostgreSQL as the proxy's
   directory does on every refresh (`apps.selectors.policy_indexes`) for an
   organization with those 500 Apps (kept in the bench database).
2. Decision to forwarded request: the real proxy (`manage.py run_egress_proxy`), a real
   sandbox and an HTTPS fake App on loopback (its own process; it notes the monotonic
   time each request arrives). One at a time: a request is started from inside the
   sandbox (a thread here calling `services.sandbox_exec`), parks; once its
   ApprovalRequest row is pending, t0 = now and `decide_approval(approve_once)`; the
   App notes t1; latency = t1 - t0. Where the time goes: a Redis subscriber beside the
   App notes when the wake-up is published, and this process times decide_approval's
   SQL statements and its two on-commit callbacks (by wrapping them here).

Own environment, so it never meets the test suite: database quor_bench_approvals
(created and migrated if missing, left in place), Redis db 5, deployment
"benchapprovals", subnet 10.235.0.0/24 (10.234.0.0/24 belongs to another deployment on
this machine), proxy port 29899, DNS 127.0.0.1:29353, fake App port 29446, scratch
directory /tmp/quor-bench-approvals (the proxy's log is there). Removes the processes,
the sandbox and the Docker network it made.
"""

import argparse
import contextlib
import ipaddress
import json
import multiprocessing
import os
import queue
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    bench_member,
    ensure_database,
    host_cpu_times,
    port_free,
    port_open,
    process_group_alive,
    remove_network,
)

WORK = Path("/tmp/quor-bench-approvals")  # noqa: S108  (the bench's own scratch directory)
DATABASE = "quor_bench_approvals"
DEPLOYMENT = "benchapprovals"
REDIS_URL = "redis://127.0.0.1:6379/5"
SUBNET = "10.235.0.0/24"  # 10.234.0.0/24 is taken by the "try" deployment
GATEWAY = str(next(ipaddress.ip_network(SUBNET).hosts()))
PROXY_PORT = 29899
DNS_ADDRESS = ("127.0.0.1", 29353)
APP_HOST, APP_PORT = "fakeapp.bench", 29446
APP_TOKEN = "ghp_bench-app-token-not-a-real-one-0123456789"  # noqa: S105
APP_PATH = "/repos/acme/widgets/issues"
WAKEUP_CHANNEL = f"quor:approvals:{DEPLOYMENT}"  # approvals.wakeup.channel(), checked below
BENCH_EMAIL = "approvals-bench@bench.test"
ORG_SLUG, BIG_ORG_SLUG = "approvals-bench", "approvals-bench-500"

# Forced, not defaulted: an inherited test or dev environment must never leak in.
os.environ.update(
    {
        "DJANGO_SETTINGS_MODULE": "quor.settings",
        "QUOR_DEBUG": "1",
        "QUOR_DEPLOYMENT": DEPLOYMENT,
        "QUOR_SANDBOX_SUBNET": SUBNET,
        "QUOR_EGRESS_PROXY_PORT": str(PROXY_PORT),
        "DATABASE_URL": f"postgresql:///{DATABASE}",
        "REDIS_URL": REDIS_URL,
        "QUOR_EGRESS_CA_DIR": str(WORK / "egress-ca"),
        "QUOR_EXTRA_CA_BUNDLE": str(WORK / "upstream-ca.crt"),
        "QUOR_EGRESS_DNS_SERVER": "{}:{}".format(*DNS_ADDRESS),
        "QUOR_EGRESS_PRIVATE_ALLOWLIST": f"{APP_HOST}:{APP_PORT}",
        "QUOR_SANDBOX_API_URL": "http://127.0.0.1:29000",
        "QUOR_APPROVAL_TIMEOUT_SECONDS": "120",
    }
)


def seeded(seed: int) -> random.Random:
    return random.Random(seed)  # noqa: S311  (reproducible bench data, not secrets)


def percentile(values, q):
    """Nearest rank on sorted values."""
    return values[min(len(values) - 1, round(q * (len(values) - 1)))] if values else None


# --- 1. policy evaluation ------------------------------------------------------------------

RESOURCES = [
    "issues", "pulls", "comments", "labels", "milestones", "releases", "branches",
    "commits", "hooks", "teams", "members", "projects", "columns", "cards", "files",
    "pages", "tasks", "boards", "sprints", "channels", "messages", "reactions", "threads",
    "users", "groups", "keys", "secrets", "variables", "workflows", "runs", "jobs",
    "artifacts", "deployments", "environments", "statuses", "checks", "reviews", "tags",
    "notes", "invoices",
]  # fmt: skip
PREFIXES = ["repos", "projects", "workspaces", "orgs", "sites", "spaces"]
SUBRESOURCES = ["comments", "events", "assignees", "merge", "history", "attachments"]
TEMPLATES = [
    "/{p}/{owner}/{repo}/{r}",
    "/{p}/{owner}/{repo}/{r}/{id}",
    "/{p}/{owner}/{repo}/{r}/{id}/{s}",
    "/{p}/{owner}/{repo}/{r}/**",
    "/{p}/{owner}/{r}",
    "/{r}/{id}",
    "/{r}/search/**",
    "/v1/{r}",
    "/v1/{r}/{id}/{s}",
]
METHOD_SETS = [("GET",), ("GET",), ("POST",), ("PUT", "PATCH"), ("DELETE",), ()]
POLICY_WEIGHTS = {"auto": 50, "ask": 35, "deny": 15}
VALUES = ["acme", "widgets", "42", "1337", "main", "a1b2c3", "PROJ-17", "readme"]
TAILS = ["", "/x", "/docs/readme.md", "/a/b/c/d", "/v2.1.0"]


def app_definitions(count: int, actions: int, rng: random.Random) -> list[dict]:
    """Catalog-like Apps: every 10th on a wildcard host (like *.atlassian.net), every
    7th with a base path (like GitHub Enterprise's /api/v3), the rest on their own host."""
    apps = []
    for i in range(count):
        if i % 10 == 3:
            url, example_host, base = f"https://*.site{i}.example", f"team{i}.site{i}.example", ""
        elif i % 7 == 5:
            host = f"git{i}.corp.example"
            url, example_host, base = f"https://{host}/api/v3", host, "/api/v3"
        else:
            host = f"api.vendor{i}.example"
            url, example_host, base = f"https://{host}", host, ""
        action_list = []
        for k in range(actions):
            resource = RESOURCES[k % len(RESOURCES)] + ("" if k < len(RESOURCES) else "_admin")
            prefix = rng.choice(PREFIXES)
            paths = []
            for template in rng.sample(TEMPLATES, rng.choice([1, 1, 2, 2, 3, 4])):
                paths.append(
                    template.replace("{p}", prefix)
                    .replace("{r}", resource)
                    .replace("{s}", rng.choice(SUBRESOURCES))
                )
            action_list.append(
                {
                    "key": f"{resource}.{k}",
                    "name": f"Action {k} on {resource}",
                    "methods": list(rng.choice(METHOD_SETS)),
                    "paths": paths,
                    "policy": rng.choices(
                        list(POLICY_WEIGHTS), weights=list(POLICY_WEIGHTS.values())
                    )[0],
                }
            )
        apps.append(
            {
                "id": i + 1,
                "name": f"Bench App {i}",
                "url": url,
                "host": example_host,
                "base": base,
                "actions": action_list,
            }
        )
    return apps


def build_index(definitions):
    from apps import policy

    return policy.AppIndex(
        policy.App(
            app_id=d["id"],
            name=d["name"],
            url_patterns=(policy.parse_url_pattern(d["url"]),),
            actions=tuple(
                policy.Action.build(a["key"], a["name"], a["policy"], a["methods"], a["paths"])
                for a in d["actions"]
            ),
        )
        for d in definitions
    )


def _instantiate(path: str, rng: random.Random) -> str:
    if path.endswith("/**"):
        path = path[:-3] + rng.choice(TAILS)
    return re.sub(r"\{[^}]+\}", lambda _: rng.choice(VALUES), path) or "/"


def request_mix(definitions, count: int, rng: random.Random) -> list[tuple[str, tuple]]:
    """(category, (method, host, target)): 60 % hits on an action, 20 % paths on an
    App's host that no action has (half of them near misses that share a prefix with
    the actions), 20 % hosts no App owns."""
    requests = []
    for n in range(count):
        roll = rng.random()
        app = rng.choice(definitions)
        if roll < 0.6:
            action = rng.choice(app["actions"])
            path = _instantiate(rng.choice(action["paths"]), rng)
            method = rng.choice(action["methods"] or ["GET", "POST", "PATCH", "DELETE"])
            if rng.random() < 0.2:
                path += "?page=2&per_page=100"
            requests.append(("hit", (method, app["host"], app["base"] + path)))
        elif roll < 0.8:
            if n % 2:
                path = f"/{rng.choice(PREFIXES)}/acme/widgets/nothing-{n}/here"
            else:
                path = f"/unknown/{n}/thing"
            method = rng.choice(["GET", "POST"])
            requests.append(("uncataloged", (method, app["host"], app["base"] + path)))
        else:
            host = f"api.unknown{n}.example.org"
            requests.append(("unknown host", ("GET", host, f"/v1/things/{n}")))
    return requests


def time_policy(definitions, calls: int, rng: random.Random, targets=None) -> dict:
    """`targets`: the Apps the requests go to (default: all of them)."""
    from apps import policy

    index = build_index(definitions)
    ids = sorted(index.apps)
    session = policy.SessionApps(
        selected=frozenset(i for i in ids if i % 4),  # a quarter not selected
        grants=frozenset(
            (i, d["actions"][0]["key"]) for i, d in zip(ids, definitions, strict=True)
        ),
    )
    mix = request_mix(targets or definitions, 20_000, rng)
    decide = policy.decide_app_request
    clock = time.perf_counter_ns
    durations = [0] * calls
    categories = [""] * calls
    outcomes: dict[str, int] = {}
    for i in range(2000):  # warm-up
        method, host, target = mix[i % len(mix)][1]
        decide(index, session, method=method, scheme="https", host=host, port=443, target=target)
    began = clock()
    for i in range(calls):
        category, (method, host, target) = mix[i % len(mix)]
        start = clock()
        decision = decide(
            index, session, method=method, scheme="https", host=host, port=443, target=target
        )
        durations[i] = clock() - start
        categories[i] = category
        outcomes[decision.outcome] = outcomes.get(decision.outcome, 0) + 1
    wall = clock() - began
    by_category = {}
    for category in ("hit", "uncataloged", "unknown host"):
        values = sorted(d for d, c in zip(durations, categories, strict=True) if c == category)
        by_category[category] = percentile(values, 0.5) / 1000
    durations.sort()
    return {
        "apps": len(index),
        "targets": len(targets or definitions),
        "actions": sum(len(a.actions) for a in index.apps.values()),
        "regexes": sum(len(x._regexes) for a in index.apps.values() for x in a.actions),
        "calls": calls,
        "median": percentile(durations, 0.5) / 1000,
        "p99": percentile(durations, 0.99) / 1000,
        "mean": statistics.fmean(durations) / 1000,
        "max": durations[-1] / 1000,
        "loop_mean": wall / calls / 1000,
        "by_category": by_category,
        "outcomes": outcomes,
    }


def time_index_build(definitions, repeat: int = 3) -> float:
    """Seconds to build the index from plain data (pattern compilation included)."""
    times = []
    for _ in range(repeat):
        re.purge()  # the directory's rebuild meets a cold re cache: 512 entries, many more patterns
        started = time.perf_counter()
        build_index(definitions)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def time_policy_indexes_from_database(definitions, repeat: int = 5) -> tuple[float, int]:
    """What the proxy's directory pays for an organization with these Apps, on every
    refresh (2 s, per proxy process): `policy_indexes` reads and compiles them all."""
    from django.db import transaction

    from apps.models import App, AppAction
    from apps.selectors import policy_indexes
    from quor import services as quor_services
    from quor.models import Organization

    organization = Organization.objects.filter(slug=BIG_ORG_SLUG).first()
    organization = organization or quor_services.organization_create(
        slug=BIG_ORG_SLUG, name="Approvals bench, 500 Apps"
    )
    wanted = sum(len(d["actions"]) for d in definitions)
    have = AppAction.objects.filter(app__organization=organization).count()
    if App.objects.filter(organization=organization).count() != len(definitions) or have != wanted:
        with transaction.atomic():
            App.objects.filter(organization=organization).delete()
            apps = App.objects.bulk_create(
                App(
                    organization=organization,
                    catalog_key=f"bench{i}",
                    name=d["name"],
                    url_patterns=[d["url"]],
                )
                for i, d in enumerate(definitions)
            )
            AppAction.objects.bulk_create(
                (
                    AppAction(
                        app=app,
                        key=a["key"],
                        name=a["name"],
                        methods=a["methods"],
                        paths=a["paths"],
                        policy=a["policy"],
                    )
                    for app, d in zip(apps, definitions, strict=True)
                    for a in d["actions"]
                ),
                batch_size=2000,
            )
    times = []
    for _ in range(repeat):
        re.purge()
        started = time.perf_counter()
        indexes = policy_indexes([organization.pk])
        times.append(time.perf_counter() - started)
    return statistics.median(times), len(indexes[organization.pk])


# --- 2. the fake App and the wake-up watcher: their own process ---------------------------


def serve_fake_app(cert: Path, key: Path, events, ready) -> None:
    """HTTPS on APP_PORT: notes (seq, monotonic arrival, Authorization right?) as soon as
    a request's head is read, then answers 201. Also the fake DNS server, and a Redis
    subscriber on the approvals channel that notes when each wake-up is published."""
    import asyncio
    import ssl

    import redis

    from tests.fakes import FakeDnsServer

    dns = FakeDnsServer(*DNS_ADDRESS)
    dns.records[APP_HOST] = ["127.0.0.1"]
    subscribed = threading.Event()

    def watch_wakeups():
        client = redis.Redis.from_url(REDIS_URL)
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        pubsub.subscribe(WAKEUP_CHANNEL)
        pubsub.get_message(timeout=2)
        subscribed.set()
        for message in pubsub.listen():
            if message.get("type") == "message":
                seen = time.monotonic()
                for decision in json.loads(message["data"]).get("decisions", []):
                    events.put(("wakeup", decision["id"], seen))

    threading.Thread(target=watch_wakeups, daemon=True).start()
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(str(cert), str(key))
    expected = f"bearer {APP_TOKEN}".encode()

    async def handle(reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                arrived = time.monotonic()
                lower = head.lower()
                headers = dict(
                    line.split(b":", 1) for line in lower.split(b"\r\n")[1:] if b":" in line
                )
                length = int(headers.get(b"content-length", b"0").strip() or 0)
                if length:
                    await reader.readexactly(length)
                seq = int(headers.get(b"x-bench-seq", b"-1").strip())
                authorized = headers.get(b"authorization", b"").strip() == expected
                events.put(("app", seq, arrived, authorized, head.split(b" ", 2)[1].decode()))
                body = b'{"number": 1}'
                writer.write(
                    b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError, ValueError):
            pass
        finally:
            writer.close()

    async def main():
        server = await asyncio.start_server(handle, "127.0.0.1", APP_PORT, ssl=tls)
        subscribed.wait(10)
        ready.set()
        await server.serve_forever()

    asyncio.run(main())


# Runs inside the sandbox: one POST through the proxy (CONNECT, then TLS with Quor's CA,
# as the session); prints the status and when (monotonic: the same clock as the host's).
CLIENT = r"""
import base64, http.client, json, os, ssl, sys, time, urllib.parse
cfg = json.loads(sys.argv[1])
proxy = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"])
pair = urllib.parse.unquote(proxy.username) + ":" + urllib.parse.unquote(proxy.password)
started = time.monotonic()
conn = http.client.HTTPSConnection(
    proxy.hostname, proxy.port, timeout=cfg["timeout"], context=ssl.create_default_context()
)
conn.set_tunnel(cfg["host"], cfg["port"], headers={
    "Proxy-Authorization": "Basic " + base64.b64encode(pair.encode()).decode()
})
conn.request("POST", cfg["path"], body=b'{"title": "bench"}', headers={
    "Content-Type": "application/json", "x-bench-seq": str(cfg["seq"])
})
response = conn.getresponse()
body = response.read().decode(errors="replace")
done = time.monotonic()
print(json.dumps({"status": response.status, "body": body[:400], "started": started, "done": done}))
"""


# --- processes ------------------------------------------------------------------------------


class Proxy:
    """Quor's proxy in its own process group (proxy.py forks its acceptors)."""

    def __init__(self, argv: list[str]):
        self.log = WORK / "quor-proxy.log"
        with open(self.log, "wb") as output:
            self.process = subprocess.Popen(  # noqa: S603
                argv,
                cwd=ROOT,
                env=os.environ.copy(),
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started_at = time.time()

    def wait_listening(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not port_open(GATEWAY, PROXY_PORT):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the proxy did not start: see {self.log}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        deadline = time.monotonic() + 10  # the acceptors may outlive the main process
        while process_group_alive(self.process.pid):
            signal_number = signal.SIGTERM if time.monotonic() < deadline else signal.SIGKILL
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal_number)
            time.sleep(0.2)


# --- 2. measuring ---------------------------------------------------------------------------


class Events:
    """What the fake App's process reports, by kind."""

    def __init__(self, channel):
        self.channel = channel
        self.app: dict[int, tuple] = {}
        self.wakeups: dict[str, float] = {}

    def _drain(self, timeout: float) -> None:
        try:
            item = self.channel.get(timeout=timeout)
        except queue.Empty:
            return
        while True:
            if item[0] == "app":
                self.app[item[1]] = item[2:]
            else:
                self.wakeups[item[1]] = item[2]
            try:
                item = self.channel.get_nowait()
            except queue.Empty:
                return

    def wait_app(self, seq: int, timeout: float):
        deadline = time.monotonic() + timeout
        while seq not in self.app and time.monotonic() < deadline:
            self._drain(0.05)
        return self.app.get(seq)

    def wait_wakeup(self, approval_id: str, timeout: float):
        deadline = time.monotonic() + timeout
        while approval_id not in self.wakeups and time.monotonic() < deadline:
            self._drain(0.05)
        return self.wakeups.get(approval_id)


class Stopwatch:
    """Notes when functions start and end, by wrapping them (in this process only)."""

    def __init__(self):
        self.marks: dict[str, tuple[float, float]] = {}

    def wrap(self, module, name: str, label: str) -> None:
        original = getattr(module, name)

        def timed(*args, **kwargs):
            started = time.monotonic()
            try:
                return original(*args, **kwargs)
            finally:
                self.marks[label] = (started, time.monotonic())

        setattr(module, name, timed)


def measure_latency(args, user, session, events: Events) -> list[dict]:
    from django.db import connection, connections

    from approvals import services as approvals
    from approvals import wakeup
    from approvals.models import ApprovalRequest
    from sandboxes.runtime import services
    from sandboxes.sessions import services as sessions

    # decide_approval's two on-commit callbacks, in the order it registers them: the
    # session's approval_decided event to the channel layer, then the proxy's wake-up.
    stopwatch = Stopwatch()
    stopwatch.wrap(sessions, "_publish", "events")
    stopwatch.wrap(wakeup, "publish", "wakeup")
    sql: list[tuple[float, float, str]] = []  # per statement of decide_approval: start, end

    def timed_sql(execute, statement, *args):
        started = time.monotonic()
        try:
            return execute(statement, *args)
        finally:
            sql.append((started, time.monotonic(), statement))

    rows = []
    for seq in range(args.warmup + args.requests):
        cfg = {"host": APP_HOST, "port": APP_PORT, "path": APP_PATH, "seq": seq, "timeout": 150}
        outcome = {}

        def run(cfg=cfg, outcome=outcome):
            try:
                result = services.sandbox_exec(
                    user=user,
                    session=session,
                    argv=["python3", "-c", CLIENT, json.dumps(cfg)],
                    timeout_s=170,
                )
                outcome["exit"] = result.exit_code
                outcome["stdout"] = result.stdout.decode(errors="replace")
                outcome["stderr"] = result.stderr.decode(errors="replace")
            except Exception as exc:
                outcome["error"] = repr(exc)
            finally:
                connections.close_all()  # this thread's own connection

        thread = threading.Thread(target=run, name=f"sandbox-request-{seq}", daemon=True)
        launched = time.monotonic()
        thread.start()
        deadline = launched + 60
        approval_id = None
        while approval_id is None:
            approval_id = (
                ApprovalRequest.objects.filter(
                    session=session, status=ApprovalRequest.Status.PENDING
                )
                .values_list("pk", flat=True)
                .first()
            )
            if approval_id is None:
                if time.monotonic() > deadline or not thread.is_alive():
                    thread.join(5)
                    raise SystemExit(f"request {seq} never parked: {outcome}")
                time.sleep(0.005)
        parked = time.monotonic()
        if seq in events.app:
            raise SystemExit(f"request {seq} reached the App before any decision")
        stopwatch.marks.clear()
        t0 = time.monotonic()
        sql.clear()
        with connection.execute_wrapper(timed_sql):
            approvals.decide_approval(user=user, approval_id=approval_id, decision="approve_once")
        decided = time.monotonic()
        arrival = events.wait_app(seq, 30)
        thread.join(60)
        if arrival is None or thread.is_alive():
            raise SystemExit(f"request {seq} was not forwarded after approval: {outcome}")
        t1, authorized, path = arrival
        wakeup_seen = events.wait_wakeup(str(approval_id), 5)
        try:
            reply = json.loads(outcome["stdout"].strip().splitlines()[-1])
        except (KeyError, IndexError, ValueError):
            raise SystemExit(f"the sandbox's request {seq} failed: {outcome}") from None
        row = {
            "seq": seq,
            "warmup": seq < args.warmup,
            "park": parked - launched,  # exec start + connect + TLS + parking, and our polling
            "latency": t1 - t0,
            "decide": decided - t0,
            "wakeup": None if wakeup_seen is None else wakeup_seen - t0,
            "in_sandbox": reply["done"] - t0,  # the 201 back in the sandbox
            "committed": stopwatch.marks["events"][0] - t0,
            "events_publish": stopwatch.marks["events"][1] - stopwatch.marks["events"][0],
            "wakeup_publish": stopwatch.marks["wakeup"][1] - stopwatch.marks["wakeup"][0],
            "wakeup_sent": stopwatch.marks["wakeup"][1] - t0,
            "after_publish": decided - stopwatch.marks["wakeup"][1],
            "queries": sum(1 for q in sql if q[0] < stopwatch.marks["events"][0]),
            "query_time": sum(e - b for b, e, _ in sql if b < stopwatch.marks["events"][0]),
            "status": reply["status"],
            "authorized": authorized,
            "path": path,
        }
        rows.append(row)
        if args.show_sql:
            for started, ended, statement in sql:
                print(
                    f"    at {(started - t0) * 1000:6.2f} ms, {(ended - started) * 1000:5.2f} ms: "
                    + statement[:150]
                )
        print(
            f"  {'warm-up' if row['warmup'] else 'request'} {seq:>3}: decision → App "
            f"{row['latency'] * 1000:6.2f} ms (decide_approval {row['decide'] * 1000:6.2f} ms, "
            f"wake-up published +{(row['wakeup'] or float('nan')) * 1000:5.2f} ms, "
            f"201 in the sandbox +{row['in_sandbox'] * 1000:6.2f} ms)  status {row['status']}"
            f"{'' if authorized else '  NO CREDENTIAL'}",
            flush=True,
        )
        time.sleep(0.2)
    return rows


def setup_data():
    """The org, user, provider, App (one Ask action among others, the org's credential),
    the sandbox and a session that selected the App; earlier bench sessions go."""
    from apps.models import App, AppAction, AppCredential
    from sandboxes.models import Session
    from sandboxes.runtime import services

    organization, user, provider = bench_member(
        slug=ORG_SLUG, name="Approvals bench", email=BENCH_EMAIL
    )
    App.objects.filter(organization=organization).delete()
    app = App.objects.create(
        organization=organization,
        catalog_key="github",
        name="BenchHub",
        url_patterns=[f"https://{APP_HOST}:{APP_PORT}"],
    )
    for key, method, path, policy in [
        ("repos.read", "GET", "/repos/{owner}/{repo}", "auto"),
        ("issues.create", "POST", "/repos/{owner}/{repo}/issues", "ask"),
        ("pulls.merge", "PUT", "/repos/{owner}/{repo}/pulls/{n}/merge", "ask"),
        ("repos.delete", "DELETE", "/repos/{owner}/{repo}", "deny"),
    ]:
        AppAction.objects.create(
            app=app, key=key, name=key, methods=[method], paths=[path], policy=policy
        )
    AppCredential.objects.create(app=app, secret=APP_TOKEN)
    sandbox = services.sandbox_ensure(user=user)
    session = Session.objects.create(
        owner=user, sandbox=sandbox, model_provider=provider, model_name="claude-bench"
    )
    session.apps.set([app])
    return user, sandbox, session


# --- report ---------------------------------------------------------------------------------


def us(value) -> str:
    return f"{value:.1f}"


def report_policy(results: list[dict], build: dict) -> bool:
    print()
    print("1. App policy evaluation (decide_app_request, one call timed at a time), µs per call")
    print()
    print(
        "| Apps | requests to | actions | patterns | calls | median | p99 | mean | max "
        "| median: hit / uncataloged / unknown host | outcomes |"
    )
    print("| --- |" + " --- |" * 10)
    for r in results:
        cats = r["by_category"]
        outcomes = ", ".join(f"{k} {v * 100 / r['calls']:.0f}%" for k, v in r["outcomes"].items())
        print(
            f"| {r['apps']} | {r['targets']} Apps | {r['actions']} | {r['regexes']} "
            f"| {r['calls']} | {us(r['median'])} "
            f"| {us(r['p99'])} | {us(r['mean'])} | {us(r['max'])} | {us(cats['hit'])} / "
            f"{us(cats['uncataloged'])} / {us(cats['unknown host'])} | {outcomes} |"
        )
    big = results[0]
    met = big["median"] < 200
    print()
    print(
        f"Target: median < 200 µs with {big['apps']} Apps: {big['median']:.1f} µs "
        f"{'PASS' if met else 'MISS'}; with {results[1]['apps']} Apps "
        f"{results[1]['median']:.1f} µs (ratio {big['median'] / results[1]['median']:.2f}); "
        f"{big['apps']} Apps with requests to {results[2]['targets']} of them: "
        f"{results[2]['median']:.1f} µs"
    )
    print(
        f"Building the {big['apps']}-App index from plain data (compiling its patterns): "
        f"{build['pure'] * 1000:.0f} ms; policy_indexes() from PostgreSQL for an organization "
        f"with those {build['db_apps']} Apps (what the proxy's directory does on every "
        f"refresh): {build['db'] * 1000:.0f} ms"
    )
    return met


def report_latency(rows: list[dict]) -> bool:
    measured = [r for r in rows if not r["warmup"]]
    print()
    print(
        f"2. Decision → forwarded request, {len(measured)} requests parked one at a time "
        f"(after {len(rows) - len(measured)} warm-up), ms"
    )
    print()
    print("| measure | min | median | p90 | max |")
    print("| --- | --- | --- | --- | --- |")

    def line(label, values):
        values = sorted(v * 1000 for v in values if v is not None)
        if not values:
            print(f"| {label} | — | — | — | — |")
            return None
        print(
            f"| {label} | {values[0]:.2f} | {percentile(values, 0.5):.2f} "
            f"| {percentile(values, 0.9):.2f} | {values[-1]:.2f} |"
        )
        return percentile(values, 0.5)

    median = line("decide_approval() called → request at the App", [r["latency"] for r in measured])
    line("decide_approval() call itself", [r["decide"] for r in measured])
    line("  of which: until committed", [r["committed"] for r in measured])
    line(
        f"    in its {measured[0]['queries']} SQL statements (the rest: ORM, COMMIT)",
        [r["query_time"] for r in measured],
    )
    line(
        "  of which: session event to the channel layer (on commit)",
        [r["events_publish"] for r in measured],
    )
    line(
        "  of which: wake-up published to Redis (on commit)",
        [r["wakeup_publish"] for r in measured],
    )
    line("  of which: after the wake-up (refresh_from_db)", [r["after_publish"] for r in measured])
    line(
        "decide_approval() called → wake-up publish returned", [r["wakeup_sent"] for r in measured]
    )
    line("decide_approval() called → wake-up seen on Redis", [r["wakeup"] for r in measured])
    line(
        "wake-up seen → request at the App",
        [r["latency"] - r["wakeup"] for r in measured if r["wakeup"] is not None],
    )
    line("decide_approval() called → 201 back in the sandbox", [r["in_sandbox"] for r in measured])
    line("request started (exec) → row pending", [r["park"] for r in measured])
    statuses = {r["status"] for r in rows}
    authorized = sum(r["authorized"] for r in rows)
    print()
    print(
        f"Every request: status {sorted(statuses)}, App credential injected in {authorized} of "
        f"{len(rows)}, path {sorted({r['path'] for r in rows})}"
    )
    met = median is not None and median < 100 and statuses == {201} and authorized == len(rows)
    print(
        f"Target: median decision → forwarded < 100 ms: "
        f"{'—' if median is None else f'{median:.2f} ms'} {'PASS' if met else 'MISS'}"
    )
    return met


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000, help="policy calls per index")
    parser.add_argument("--apps", type=int, default=500)
    parser.add_argument("--actions", type=int, default=50, help="actions per App")
    parser.add_argument("--requests", type=int, default=30, help="parked requests measured")
    parser.add_argument("--warmup", type=int, default=3, help="parked requests not measured")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--skip-policy", action="store_true")
    parser.add_argument("--show-sql", action="store_true", help="decide_approval's statements")
    parser.add_argument("--skip-latency", action="store_true")
    args = parser.parse_args()
    # SIGTERM (and SIGINT even when a shell started us in the background, ignoring it)
    # end the run through the `finally` below, which removes what the bench made.
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda signum, frame: sys.exit(128 + signum))
    began = time.monotonic()
    load_before = os.getloadavg()
    print(
        f"{os.cpu_count()} CPUs, load average {load_before[0]:.2f} {load_before[1]:.2f} "
        f"{load_before[2]:.2f}",
        flush=True,
    )
    for port in (PROXY_PORT, APP_PORT):
        if not port_free(port):
            raise SystemExit(f"port {port} is in use here: another run?")

    WORK.mkdir(parents=True, exist_ok=True)
    ensure_database(DATABASE)
    from tests.fakes import make_test_ca

    _, cert, key = make_test_ca(WORK, [APP_HOST])
    fork = multiprocessing.get_context("fork")
    channel, ready = fork.Queue(), fork.Event()
    fake_app = fork.Process(target=serve_fake_app, args=(cert, key, channel, ready), daemon=True)
    fake_app.start()

    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from approvals import wakeup
    from egress import readiness
    from sandboxes.runtime import services

    assert wakeup.channel() == WAKEUP_CHANNEL, wakeup.channel()

    verdicts = {}
    proxy = sandbox = None
    cleanup = []
    host_before = host_cpu_times()
    try:
        if not args.skip_policy:
            print("1. policy evaluation", flush=True)
            rng = seeded(args.seed)
            big = app_definitions(args.apps, args.actions, rng)
            small = app_definitions(5, args.actions, seeded(args.seed + 1))
            results = []
            for definitions, targets in ((big, None), (small, None), (big, big[:5])):
                result = time_policy(definitions, args.calls, seeded(args.seed + 2), targets)
                results.append(result)
                print(
                    f"  {result['apps']} Apps, requests to {result['targets']}: "
                    f"median {result['median']:.1f} µs, "
                    f"p99 {result['p99']:.1f} µs, mean {result['mean']:.1f} µs",
                    flush=True,
                )
            build = {"pure": time_index_build(big)}
            build["db"], build["db_apps"] = time_policy_indexes_from_database(big)
            policy_report = (results, build)

        if not args.skip_latency:
            print("2. decision → forwarded request", flush=True)
            if not ready.wait(15):
                raise SystemExit("the fake App did not start")
            user, sandbox, session = setup_data()
            print(f"  sandbox {sandbox.pk} at {sandbox.network_address}", flush=True)
            proxy = Proxy([sys.executable, "manage.py", "run_egress_proxy"])
            proxy.wait_listening()
            deadline = time.monotonic() + 30
            while True:
                state = readiness.readiness()
                if state and state["at"] >= proxy.started_at and state["sandboxes"] >= 1:
                    break
                if time.monotonic() > deadline or proxy.process.poll() is not None:
                    raise SystemExit(f"the proxy never reported ready: see {proxy.log}")
                time.sleep(0.2)
            print(f"  proxy ready on {state['listen']}", flush=True)
            host_before = host_cpu_times()
            rows = measure_latency(args, user, session, Events(channel))
            host_after = host_cpu_times()
            busy = (host_after[0] - host_before[0]) / max(host_after[1] - host_before[1], 1)
    finally:
        if proxy is not None:
            proxy.stop()
            cleanup.append("proxy stopped")
        if sandbox is not None:
            try:
                services.sandbox_destroy(sandbox=sandbox)
                cleanup.append("sandbox destroyed")
            except Exception as exc:
                cleanup.append(f"sandbox NOT destroyed: {exc!r}")
        fake_app.terminate()
        fake_app.join(5)
        cleanup.append("fake App stopped")
        if not args.skip_latency:
            try:
                cleanup.append(remove_network())
            except Exception as exc:
                cleanup.append(f"network NOT removed: {exc!r}")
        print("cleanup: " + "; ".join(cleanup), flush=True)

    if not args.skip_policy:
        verdicts["policy"] = report_policy(*policy_report)
    if not args.skip_latency:
        verdicts["latency"] = report_latency(rows)
        print(f"Host busy during part 2: {busy * 100:.0f}% of {os.cpu_count()} cores")
    load_after = os.getloadavg()
    print(
        f"Load average before {load_before[0]:.2f}, after {load_after[0]:.2f}; "
        f"the bench took {time.monotonic() - began:.0f} s"
    )
    print("Verdicts: " + ", ".join(f"{k} {'PASS' if v else 'MISS'}" for k, v in verdicts.items()))


if __name__ == "__main__":
    main()
