#!/usr/bin/env python3
"""Egress proxy throughput and latency: Quor's proxy against a bare proxy.py.

    .venv/bin/python bench/egress.py [--seconds 5] [--warmup 1] [--concurrency 1,50]
        [--only refresh|traffic] [--refresh-apps 500] [--refresh-actions 50]

First (`--only refresh` alone: no Docker, no proxy), the directory's refresh for an
organization with 500 Apps of 50 actions each, each App with the organization's
credential (kept in the bench database), one sandbox row of its user (an address, no
container): a full build (a new `ContextLoader`: what every refresh did before it kept
Apps), a refresh with nothing changed, and refreshes after one App's action policy or
credential changed; medians of 5, each after one unmeasured run. And the server side
of the TLS set-up towards the sandbox per intercepted connection, in memory: as proxy.py
does it against the proxy's kept per-host context.

Then the traffic (`--only traffic` alone):
it starts on this host a fast upstream (asyncio: plain HTTP, and HTTPS with a test-CA
certificate), the fake DNS server of the tests, and Quor's egress proxy
(`manage.py run_egress_proxy`) on the bench sandbox bridge; makes an org, a user, an
Anthropic-kind model provider pointing at the HTTPS upstream and the user's sandbox;
then runs a small load generator (stdlib, one thread and one connection per
concurrent client) INSIDE the sandbox through the proxy, for each mode at each
concurrency. Then it stops Quor's proxy, starts a bare proxy.py (`--threaded`, no
plugin) on the same address and port, and measures the same modes from the same
sandbox. "Direct" (no proxy) can only be measured from the host: the sandbox's
firewall lets it reach nothing but the proxy port.

Prints one table (requests/s, median and p99 latency, errors, proxy CPU per request,
client CPU) and the two ratios the targets ask for. Own database (quor_bench, created
and migrated if missing, left in place), Redis db 4, deployment "bench", subnet
10.233.0.0/24, ports 28000-28999 and 25353; removes the processes and the sandbox it
made. Logs of the proxies: /tmp/quor-bench/*.log.
"""

import argparse
import contextlib
import ipaddress
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import ensure_database, host_cpu_times, ms, port_open, process_group_alive  # noqa: E402

WORK = Path("/tmp/quor-bench")  # noqa: S108  (the bench's own scratch directory)
DATABASE = "quor_bench"
SUBNET = "10.233.0.0/24"
GATEWAY = str(next(ipaddress.ip_network(SUBNET).hosts()))
PROXY_PORT = 28899
DNS_ADDRESS = ("127.0.0.1", 25353)
APP_HOST, APP_PORT = "app.bench", 28080  # plain HTTP
PROVIDER_HOST, PROVIDER_PORT = "provider.bench", 28443  # HTTPS, a credential route
TUNNEL_HOST, TUNNEL_PORT = "tunnel.bench", 28444  # HTTPS, not a route: tunneled
PROVIDER_KEY = "sk-bench-provider-key-not-a-real-one"
BENCH_EMAIL = "egress-bench@bench.test"
REFRESH_ORG_SLUG, REFRESH_EMAIL = "egress-bench-apps", "egress-bench-apps@bench.test"
REFRESH_ADDRESS = str(ipaddress.ip_network(SUBNET)[250])  # a row only: no container there
REFRESH_REPEAT = 5

# Forced, not defaulted: an inherited test or dev environment must never leak in.
os.environ.update(
    {
        "DJANGO_SETTINGS_MODULE": "quor.settings",
        "QUOR_DEBUG": "1",
        "QUOR_DEPLOYMENT": "bench",
        "QUOR_SANDBOX_SUBNET": SUBNET,
        "QUOR_EGRESS_PROXY_PORT": str(PROXY_PORT),
        "DATABASE_URL": f"postgresql:///{DATABASE}",
        "REDIS_URL": "redis://127.0.0.1:6379/4",
        "QUOR_EGRESS_CA_DIR": str(WORK / "egress-ca"),
        "QUOR_EXTRA_CA_BUNDLE": str(WORK / "upstream-ca.crt"),
        "QUOR_EGRESS_DNS_SERVER": "{}:{}".format(*DNS_ADDRESS),
        "QUOR_EGRESS_PRIVATE_ALLOWLIST": ",".join(
            f"{host}:{port}"
            for host, port in [
                (APP_HOST, APP_PORT),
                (PROVIDER_HOST, PROVIDER_PORT),
                (TUNNEL_HOST, TUNNEL_PORT),
            ]
        ),
        "QUOR_SANDBOX_API_URL": "http://127.0.0.1:28000",
    }
)

# --- the load generator: stdlib only, the same script on the host and in the sandbox -------

GENERATOR = r"""
import base64, json, os, socket, ssl, sys, threading, time, urllib.parse

cfg = json.loads(sys.argv[1])
host, port = cfg["target"]          # what the request names: CONNECT target or absolute URL
tls_name = cfg.get("tls_name")      # None: plain HTTP; else the TLS server name
keepalive = cfg["keepalive"]
auth = b""
proxy = cfg.get("proxy")            # None (direct to cfg["connect"]) or "env" (HTTP_PROXY)
if proxy == "env":
    url = urllib.parse.urlsplit(os.environ["HTTP_PROXY"])
    proxy = (url.hostname, url.port)
    pair = urllib.parse.unquote(url.username) + ":" + urllib.parse.unquote(url.password)
    auth = b"Proxy-Authorization: Basic " + base64.b64encode(pair.encode()) + b"\r\n"
address = proxy or tuple(cfg["connect"])
extra = b"".join(
    f"{name}: {os.environ[value[5:]] if value.startswith('$ENV:') else value}\r\n".encode()
    for name, value in cfg.get("headers", [])
)
authority = f"{host}:{port}"
if tls_name:
    request = f"GET /v1/bench HTTP/1.1\r\nHost: {tls_name}:{port}\r\n".encode() + extra + b"\r\n"
    connect_request = (
        f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n".encode() + auth + b"\r\n"
    )
    context = (
        ssl.create_default_context(cadata=cfg["cadata"])
        if cfg.get("cadata") else ssl.create_default_context()
    )
elif proxy:
    request = (
        f"GET http://{authority}/v1/bench HTTP/1.1\r\nHost: {authority}\r\n".encode()
        + auth + extra + b"\r\n"
    )
else:
    request = f"GET /v1/bench HTTP/1.1\r\nHost: {authority}\r\n".encode() + extra + b"\r\n"


def read_head(sock, buf):
    while True:
        end = buf.find(b"\r\n\r\n")
        if end >= 0:
            return buf[: end + 4], buf[end + 4 :]
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("connection closed before a response")
        buf += chunk


def connect():
    sock = socket.create_connection(address, timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if tls_name:
        if proxy:
            sock.sendall(connect_request)
            head, rest = read_head(sock, b"")
            if head.split(b" ", 2)[1] != b"200":
                sock.close()
                raise ConnectionError("CONNECT answered " + repr(head[:300]))
        sock = context.wrap_socket(sock, server_hostname=tls_name)
    return sock


def exchange(sock, buf):
    sock.sendall(request)
    head, buf = read_head(sock, buf)
    lower = head.lower()
    at = lower.find(b"\r\ncontent-length:")
    length = int(lower[at + 17 : lower.find(b"\r\n", at + 2)]) if at >= 0 else 0
    while len(buf) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("connection closed in the body")
        buf += chunk
    if head[9:12] != b"200":
        raise RuntimeError(repr(head[:200]) + " " + repr(buf[:length][:200]))
    return buf[length:]


launched = time.perf_counter()
window_start = launched + cfg["warmup"]
window_end = window_start + cfg["seconds"]
results = []


def worker():
    latencies, connects, messages = [], [], []
    errors = total = opened = 0
    sock, buf = None, b""
    while time.perf_counter() < window_end:
        began = None
        try:
            if sock is None:
                began = time.perf_counter()
                sock, buf = connect(), b""
                opened += 1
                if began >= window_start:
                    connects.append(time.perf_counter() - began)
            sent = time.perf_counter()
            buf = exchange(sock, buf)
            done = time.perf_counter()
            total += 1
            started = sent if keepalive else began
            if started >= window_start and done <= window_end:
                latencies.append(done - started)
            if not keepalive:
                sock.close()
                sock = None
        except Exception as exc:
            if time.perf_counter() >= window_start:
                errors += 1
                if len(messages) < 3:
                    messages.append(f"{type(exc).__name__}: {exc}"[:400])
            if sock is not None:
                sock.close()
            sock = None
            time.sleep(0.05)
    if sock is not None:
        sock.close()
    results.append((latencies, connects, errors, total, messages, opened))


threads = [threading.Thread(target=worker, daemon=True) for _ in range(cfg["concurrency"])]
for thread in threads:
    thread.start()
time.sleep(max(0.0, window_start - time.perf_counter()))
cpu_start = os.times()
time.sleep(max(0.0, window_end - time.perf_counter()))
cpu_end = os.times()
for thread in threads:
    thread.join(timeout=max(0.1, window_end + 15 - time.perf_counter()))
latencies = sorted(x for r in results for x in r[0])
connects = sorted(x for r in results for x in r[1])


def percentile(values, q):
    return values[min(len(values) - 1, round(q * (len(values) - 1)))] if values else None


cpu = (cpu_end.user - cpu_start.user) + (cpu_end.system - cpu_start.system)
print(json.dumps({
    "count": len(latencies),
    "seconds": cfg["seconds"],
    "median": percentile(latencies, 0.5),
    "p99": percentile(latencies, 0.99),
    "connect_median": percentile(connects, 0.5),
    "errors": sum(r[2] for r in results),
    "total": sum(r[3] for r in results),
    "connections": sum(r[5] for r in results),
    "messages": [m for r in results for m in r[4]][:5],
    "stuck_threads": sum(t.is_alive() for t in threads),
    "client_cpu": cpu / cfg["seconds"],
}), flush=True)
os._exit(0)
"""

# --- the upstream: its own process, so its CPU and its GIL are its own --------------------

RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n\r\nok\n"
SEEN, KEY_OK, KEY_OTHER, PROVIDER_TLS, PROVIDER_TLS_RESUMED = range(5)


def serve_upstreams(cert: Path, key: Path, counters, ready) -> None:
    """Plain HTTP on APP_PORT, HTTPS on PROVIDER_PORT and TUNNEL_PORT (one certificate
    for both names), keep-alive, a fixed 3-byte body; and the fake DNS server. Counts
    requests, what arrived in x-api-key, and the TLS handshakes on PROVIDER_PORT (only
    Quor's proxy connects there) and how many of them resumed a session."""
    import asyncio
    import ssl

    from tests.fakes import FakeDnsServer

    dns = FakeDnsServer(*DNS_ADDRESS)
    dns.records.update({name: ["127.0.0.1"] for name in (APP_HOST, PROVIDER_HOST, TUNNEL_HOST)})
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(str(cert), str(key))
    key_marker = b"\r\nx-api-key:"

    async def handle(reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lower = head.lower()
                at = lower.find(b"\r\ncontent-length:")
                if at >= 0:
                    await reader.readexactly(int(lower[at + 17 : lower.find(b"\r\n", at + 2)]))
                counters[SEEN] += 1
                at = lower.find(key_marker)
                if at >= 0:
                    value = head[at + len(key_marker) : head.find(b"\r\n", at + 2)].strip()
                    counters[KEY_OK if value == PROVIDER_KEY.encode() else KEY_OTHER] += 1
                writer.write(RESPONSE)
                if writer.transport.get_write_buffer_size() > 1 << 16:
                    await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError, ValueError):
            pass
        finally:
            writer.close()

    async def handle_provider(reader, writer):
        counters[PROVIDER_TLS] += 1
        counters[PROVIDER_TLS_RESUMED] += writer.get_extra_info("ssl_object").session_reused
        await handle(reader, writer)

    async def main():
        servers = [
            await asyncio.start_server(handle, "127.0.0.1", APP_PORT, backlog=1024),
            await asyncio.start_server(
                handle_provider, "127.0.0.1", PROVIDER_PORT, ssl=tls, backlog=1024
            ),
            await asyncio.start_server(handle, "127.0.0.1", TUNNEL_PORT, ssl=tls, backlog=1024),
        ]
        ready.set()
        await asyncio.gather(*(server.serve_forever() for server in servers))

    asyncio.run(main())


# --- processes ------------------------------------------------------------------------------


def processes_cpu(*, pgid: int | None = None, name: str | None = None) -> float:
    """CPU seconds (user + system) of the live processes in a process group, or of
    those with a given command name, plus what their ended children used (so that
    PostgreSQL backends that exit between two samples still count)."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        comm = stat[stat.find("(") + 1 : stat.rfind(")")]
        fields = stat[stat.rfind(")") + 2 :].split()
        if int(fields[2]) == pgid or comm == name:
            total += sum(int(value) for value in fields[11:15])
    return total / os.sysconf("SC_CLK_TCK")


def pid_cpu(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Proxy:
    """A proxy process in its own process group (proxy.py forks its acceptors)."""

    def __init__(self, name: str, argv: list[str]):
        self.name = name
        self.log = WORK / f"{name}.log"
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
                raise SystemExit(f"{self.name} did not start: see {self.log}")
            time.sleep(0.1)

    def cpu(self) -> float:
        return processes_cpu(pgid=self.process.pid)

    def stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        # The acceptors may outlive the main process: end the rest of the group.
        deadline = time.monotonic() + 10
        while process_group_alive(self.process.pid):
            signal_number = signal.SIGTERM if time.monotonic() < deadline else signal.SIGKILL
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal_number)
            time.sleep(0.2)
        deadline = time.monotonic() + 10
        while port_open(GATEWAY, PROXY_PORT):
            if time.monotonic() > deadline:
                raise SystemExit(f"something still listens on {GATEWAY}:{PROXY_PORT}")
            time.sleep(0.1)


# --- measuring ---------------------------------------------------------------------------


def run_generator(cfg: dict, *, in_sandbox_of=None) -> dict:
    timeout = int(cfg["warmup"] + cfg["seconds"] + 30)
    argv = ["python3", "-c", GENERATOR, json.dumps(cfg)]
    if in_sandbox_of is not None:
        from sandboxes.runtime import services

        result = services.sandbox_exec(user=in_sandbox_of, argv=argv, timeout_s=timeout)
        code, out, err = result.exit_code, result.stdout, result.stderr
    else:
        argv[0] = sys.executable
        result = subprocess.run(argv, capture_output=True, timeout=timeout + 10)  # noqa: S603
        code, out, err = result.returncode, result.stdout, result.stderr
    if code != 0:
        raise SystemExit(f"the load generator failed ({code}): {err.decode(errors='replace')}")
    return json.loads(out.decode().strip().splitlines()[-1])


# --- the directory's refresh ------------------------------------------------------------------


def refresh_data(app_count: int, action_count: int):
    """The organization with `app_count` Apps of `action_count` actions (catalog-like
    paths: literal and `{name}` segments, some `/**`), each with the organization's
    credential, and one sandbox row of its user. Kept between runs; rebuilt if its
    shape differs."""
    from django.db import transaction

    from apps.models import App, AppAction, AppCredential
    from quor import services as quor_services
    from quor.models import Organization, User
    from sandboxes.models import Sandbox

    organization = Organization.objects.filter(slug=REFRESH_ORG_SLUG).first()
    organization = organization or quor_services.organization_create(
        slug=REFRESH_ORG_SLUG, name=f"Egress bench, {app_count} Apps"
    )
    user = User.objects.filter(email=REFRESH_EMAIL).first() or quor_services.member_create(
        email=REFRESH_EMAIL, organization=organization
    )
    apps = App.objects.filter(organization=organization)
    actions = AppAction.objects.filter(app__organization=organization)
    if apps.count() != app_count or actions.count() != app_count * action_count:
        with transaction.atomic():
            apps.delete()
            created = App.objects.bulk_create(
                App(
                    organization=organization,
                    catalog_key=f"bench{i}",
                    name=f"Bench App {i}",
                    url_patterns=[f"https://api.vendor{i}.example"],
                )
                for i in range(app_count)
            )
            AppAction.objects.bulk_create(
                (
                    AppAction(
                        app=app,
                        key=f"resource{k}",
                        name=f"Resource {k}",
                        methods=[("GET", "POST", "DELETE")[k % 3]],
                        paths=[f"/v1/resource{k}/{{id}}", f"/repos/{{owner}}/resource{k}/**"],
                        policy=("auto", "ask", "deny")[k % 3],
                    )
                    for app in created
                    for k in range(action_count)
                ),
                batch_size=2000,
            )
            AppCredential.objects.bulk_create(
                AppCredential(app=app, secret=f"token-{app.pk}-0123456789") for app in created
            )
    Sandbox.objects.update_or_create(
        user=user,
        defaults={"state": Sandbox.State.RUNNING, "network_address": REFRESH_ADDRESS},
    )
    return organization


def median_seconds(run) -> float:
    run()  # unmeasured: caches, connections
    times = []
    for _ in range(REFRESH_REPEAT):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2]


def measure_refresh(app_count: int, action_count: int) -> dict:
    """Seconds of the directory's refresh, full and incremental, in this process."""
    from apps import services as app_services
    from apps.models import App
    from egress.directory import ContextLoader, app_fingerprints
    from sandboxes.models import Sandbox

    organization = refresh_data(app_count, action_count)
    try:
        loader = ContextLoader()
        loader.load()
        first = App.objects.filter(organization=organization).order_by("pk").first()
        action = first.actions.order_by("pk").first()
        policies = iter(["deny", action.policy] * (REFRESH_REPEAT + 1))
        secrets = iter(f"token-changed-{n}-0123456789" for n in range(REFRESH_REPEAT + 1))

        def change_policy_and_refresh():
            app_services.app_set_action_policy(app=first, key=action.key, policy=next(policies))
            started = time.perf_counter()
            loader.load()
            return time.perf_counter() - started

        def change_credential_and_refresh():
            app_services.app_credential_set(app=first, secret=next(secrets))
            started = time.perf_counter()
            loader.load()
            return time.perf_counter() - started

        def median_of_changes(run) -> float:
            run()
            return sorted(run() for _ in range(REFRESH_REPEAT))[REFRESH_REPEAT // 2]

        return {
            "apps": app_count,
            "actions": action_count,
            "full": median_seconds(lambda: ContextLoader().load()),
            "unchanged": median_seconds(loader.load),
            "policy": median_of_changes(change_policy_and_refresh),
            "credential": median_of_changes(change_credential_and_refresh),
            "fingerprints": median_seconds(lambda: app_fingerprints([organization.pk])),
        }
    finally:
        Sandbox.objects.filter(network_address=REFRESH_ADDRESS).update(network_address=None)


def report_refresh(found: dict) -> None:
    print()
    print(
        f"Directory refresh, an organization with {found['apps']} Apps x {found['actions']} "
        f"actions, each with a credential (median of {REFRESH_REPEAT}, in this process):"
    )
    print("| refresh | ms | target |")
    print("| --- | --- | --- |")
    rows = [
        ("before: full reload, every refresh (a new ContextLoader)", found["full"], ""),
        ("nothing changed", found["unchanged"], "< 50 ms"),
        ("one App's action policy changed", found["policy"], "< 50 ms"),
        ("one App's credential changed", found["credential"], "< 50 ms"),
        ("of which the fingerprint query", found["fingerprints"], ""),
    ]
    for label, seconds, target in rows:
        verdict = ""
        if target:
            verdict = f"{target}: {'meets' if seconds < 0.05 else 'MISSES'}"
        print(f"| {label} | {seconds * 1000:.1f} | {verdict} |")
    print()


# --- the TLS set-up towards the sandbox, per intercepted connection ---------------------------

HANDSHAKES = 300


def server_handshake_seconds(server_context, client_context, host: str) -> float:
    """The server side's CPU-bound time of one TLS handshake in memory (the client's
    work, interleaved in this thread, is not counted)."""
    import ssl

    client_in, client_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    server_in, server_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_context.wrap_bio(client_in, client_out, server_hostname=host)
    server_seconds = 0.0
    server = None
    client_done = server_done = False
    while not (client_done and server_done):
        if not client_done:
            try:
                client.do_handshake()
                client_done = True
            except ssl.SSLWantReadError:
                pass
        server_in.write(client_out.read())
        started = time.perf_counter()
        if server is None:
            server = server_context().wrap_bio(server_in, server_out, server_side=True)
        if not server_done:
            try:
                server.do_handshake()
                server_done = True
            except ssl.SSLWantReadError:
                pass
        server_seconds += time.perf_counter() - started
        client_in.write(server_out.read())
    return server_seconds


def measure_leaf_tls() -> dict:
    """Per intercepted connection, the proxy's TLS set-up towards the sandbox: as
    proxy.py does it (a new context loading the host's RSA leaf and the signing key
    from disk) and from `egress.tls.LeafContexts` (the host's context, kept)."""
    import ssl

    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    from egress import ca, tls

    files = ca.ensure_ca(Path(os.environ["QUOR_EGRESS_CA_DIR"]))
    host = "provider.bench"
    signing_key = serialization.load_pem_private_key(files.signing_key.read_bytes(), None)
    leaf = ca.issue_leaf(
        serialization.load_pem_private_key(files.key.read_bytes(), None),
        x509.load_pem_x509_certificate(files.cert.read_bytes()),
        host,
        signing_key,
    )
    leaf_file = WORK / "rsa-leaf.pem"
    leaf_file.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))

    def proxy_py_context():
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(certfile=str(leaf_file), keyfile=str(files.signing_key))
        return context

    leaves = tls.LeafContexts(files)
    client_context = ssl.create_default_context(cafile=str(files.cert))
    found = {}
    for label, server_context in (
        ("proxy.py", proxy_py_context),
        ("kept", lambda: leaves.context_for(host)),
    ):
        times = sorted(
            server_handshake_seconds(server_context, client_context, host)
            for _ in range(HANDSHAKES)
        )
        found[label] = times[len(times) // 2]
    return found


def report_leaf_tls(found: dict) -> None:
    print(
        f"TLS set-up towards the sandbox per intercepted connection, server side (median of "
        f"{HANDSHAKES} in-memory handshakes, in this process): before, as proxy.py does it "
        f"(new context, RSA leaf and key read from disk) {found['proxy.py'] * 1000:.2f} ms; "
        f"now (the host's kept context, P-256 leaf) {found['kept'] * 1000:.2f} ms"
    )
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=1, help="unmeasured seconds first")
    parser.add_argument("--concurrency", default="1,50")
    parser.add_argument("--only", choices=["refresh", "traffic"])
    parser.add_argument("--refresh-apps", type=int, default=500)
    parser.add_argument("--refresh-actions", type=int, default=50)
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    began = time.monotonic()

    WORK.mkdir(parents=True, exist_ok=True)
    ensure_database(DATABASE)
    if args.only != "traffic":
        import django
        from django.core.management import call_command
        from django.db import connections

        django.setup()
        call_command("migrate", verbosity=0)
        report_refresh(measure_refresh(args.refresh_apps, args.refresh_actions))
        report_leaf_tls(measure_leaf_tls())
        connections.close_all()  # the upstream is forked next
    if args.only != "refresh":
        measure_traffic(args, levels, began)


def measure_traffic(args, levels, began) -> None:
    from tests.fakes import make_test_ca

    upstream_ca, cert, key = make_test_ca(WORK, [PROVIDER_HOST, TUNNEL_HOST])
    upstream_ca_pem = upstream_ca.read_text()
    counters = multiprocessing.get_context("fork").Array("q", 5, lock=False)
    ready = multiprocessing.get_context("fork").Event()
    upstream = multiprocessing.get_context("fork").Process(
        target=serve_upstreams, args=(cert, key, counters, ready), daemon=True
    )
    upstream.start()

    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)

    from django.db import connections

    from egress import ca, readiness
    from egress.models import EgressDecision
    from quor import services as quor_services
    from quor.models import ModelProvider, Organization, User
    from sandboxes.runtime import services

    rows = []
    quor = bare = sandbox = None
    try:
        if not ready.wait(10):
            raise SystemExit("the upstream did not start")

        def measure(label, where, proxy, cfg, *, user=None):
            cfg = {"warmup": args.warmup, "seconds": args.seconds, **cfg}
            for concurrency in levels:
                cfg["concurrency"] = concurrency
                proxy_cpu = proxy.cpu() if proxy else None
                upstream_cpu = pid_cpu(upstream.pid)
                postgres_cpu = processes_cpu(name="postgres")
                host_before = host_cpu_times()
                started = time.monotonic()
                result = run_generator(cfg, in_sandbox_of=user)
                wall = time.monotonic() - started
                host_after = host_cpu_times()
                result.update(
                    label=label,
                    where=where,
                    concurrency=concurrency,
                    keepalive=cfg["keepalive"],
                    proxy_cpu=(proxy.cpu() - proxy_cpu) / max(result["total"], 1)
                    if proxy
                    else None,
                    upstream_cpu=(pid_cpu(upstream.pid) - upstream_cpu) / wall,
                    postgres_cpu=(processes_cpu(name="postgres") - postgres_cpu) / wall,
                    host_busy=(host_after[0] - host_before[0])
                    / max(host_after[1] - host_before[1], 1),
                )
                rows.append(result)
                print(
                    f"  {label:<34} c={concurrency:<3} {result['count'] / args.seconds:8.0f} req/s"
                    f"  median {ms(result['median'])} ms  errors {result['errors']}"
                    + (f"  e.g. {result['messages'][0]}" if result["messages"] else "")
                    + (
                        f"  {result['stuck_threads']} clients stuck"
                        if result["stuck_threads"]
                        else ""
                    ),
                    flush=True,
                )

        http = {"target": [APP_HOST, APP_PORT]}
        tunnel = {
            "target": [TUNNEL_HOST, TUNNEL_PORT],
            "tls_name": TUNNEL_HOST,
            "cadata": upstream_ca_pem,  # the client trusts the upstream's CA, not Quor's
        }
        injected = {
            "target": [PROVIDER_HOST, PROVIDER_PORT],
            "tls_name": PROVIDER_HOST,
            "headers": [["x-api-key", "$ENV:ANTHROPIC_API_KEY"]],
        }
        load_before = os.getloadavg()[0]
        print(f"{os.cpu_count()} CPUs, load average {load_before:.2f}", flush=True)

        # 1. Direct, from the host (the sandbox can reach nothing but the proxy).
        print("direct, from the host:", flush=True)
        measure("direct http", "host", None, {
            **http, "connect": ["127.0.0.1", APP_PORT], "keepalive": True,
        })  # fmt: skip
        measure("direct https", "host", None, {
            **tunnel, "connect": ["127.0.0.1", TUNNEL_PORT], "keepalive": True,
        })  # fmt: skip

        # 2. The data Quor's proxy needs, the sandbox, and Quor's proxy.
        organization = Organization.objects.filter(slug="egress-bench").first()
        organization = organization or quor_services.organization_create(
            slug="egress-bench", name="Egress bench"
        )
        user = User.objects.filter(email=BENCH_EMAIL).first() or quor_services.member_create(
            email=BENCH_EMAIL, organization=organization
        )
        ModelProvider.objects.filter(organization=organization).delete()
        quor_services.model_provider_create(
            organization=organization,
            kind=ModelProvider.Kind.ANTHROPIC,
            display_name="Bench provider",
            api_key=PROVIDER_KEY,
            base_url=f"https://{PROVIDER_HOST}:{PROVIDER_PORT}",
            model_names=["claude-bench"],
        )
        sandbox = services.sandbox_ensure(user=user)
        print(f"sandbox {sandbox.pk} at {sandbox.network_address}", flush=True)

        quor = Proxy("quor-proxy", [sys.executable, "manage.py", "run_egress_proxy"])
        quor.wait_listening()
        deadline = time.monotonic() + 30
        while True:
            state = readiness.readiness()
            if state and state["at"] >= quor.started_at and state["sandboxes"] >= 1:
                break
            if time.monotonic() > deadline or quor.process.poll() is not None:
                raise SystemExit(f"Quor's proxy never reported ready: see {quor.log}")
            time.sleep(0.2)
        print(f"Quor's proxy ready on {state['listen']}", flush=True)
        quor_from = time.time()
        seen_before = list(counters)

        print("Quor's proxy, from the sandbox:", flush=True)
        proxied = {"proxy": "env"}
        measure("quor http", "sandbox", quor, {**http, **proxied, "keepalive": True}, user=user)
        measure("quor https tunnel", "sandbox", quor, {
            **tunnel, **proxied, "keepalive": True,
        }, user=user)  # fmt: skip
        measure("quor https intercepted+injected", "sandbox", quor, {
            **injected, **proxied, "keepalive": True,
        }, user=user)  # fmt: skip
        measure("quor https tunnel, new conn", "sandbox", quor, {
            **tunnel, **proxied, "keepalive": False,
        }, user=user)  # fmt: skip
        measure("quor https injected, new conn", "sandbox", quor, {
            **injected, **proxied, "keepalive": False,
        }, user=user)  # fmt: skip
        key_ok = counters[KEY_OK] - seen_before[KEY_OK]
        key_other = counters[KEY_OTHER] - seen_before[KEY_OTHER]
        upstream_tls = (
            counters[PROVIDER_TLS] - seen_before[PROVIDER_TLS],
            counters[PROVIDER_TLS_RESUMED] - seen_before[PROVIDER_TLS_RESUMED],
        )
        time.sleep(2)  # the audit thread writes every half second: let it finish
        quor.stop()
        quor = None
        audit = {}
        for outcome in EgressDecision.Outcome.values:
            audit[outcome] = EgressDecision.objects.filter(
                sandbox_id=sandbox.pk, created_at__gte=_aware(quor_from), outcome=outcome
            ).count()
        connections.close_all()

        # 3. A bare proxy.py on the same address and port, from the same sandbox. It has
        # no resolver for the fake names: the requests name the upstream by address.
        trust = ca.write_upstream_trust(
            ca.ensure_ca(Path(os.environ["QUOR_EGRESS_CA_DIR"])),
            os.environ["QUOR_EXTRA_CA_BUNDLE"],
        )
        bare = Proxy("bare-proxy", [
            sys.executable, "-m", "proxy", "--hostname", GATEWAY, "--port", str(PROXY_PORT),
            "--threaded", "--num-acceptors", "2", "--ca-file", str(trust),
            "--log-level", "ERROR",
        ])  # fmt: skip
        bare.wait_listening()
        print("bare proxy.py, from the sandbox:", flush=True)
        measure("bare http", "sandbox", bare, {
            "target": ["127.0.0.1", APP_PORT], **proxied, "keepalive": True,
        }, user=user)  # fmt: skip
        bare_tunnel = {**tunnel, "target": ["127.0.0.1", TUNNEL_PORT], **proxied}
        measure("bare https tunnel", "sandbox", bare, {**bare_tunnel, "keepalive": True}, user=user)
        measure("bare https tunnel, new conn", "sandbox", bare, {
            **bare_tunnel, "keepalive": False,
        }, user=user)  # fmt: skip
    finally:
        for proxy in (quor, bare):
            if proxy is not None:
                proxy.stop()
        if sandbox is not None:
            services.sandbox_destroy(sandbox=sandbox)
        upstream.terminate()
        upstream.join(5)
        # The bench network stays, as bench/sandbox_lifecycle.py leaves it.

    report(
        rows, levels, audit, key_ok, key_other, upstream_tls, load_before, time.monotonic() - began
    )


def _aware(timestamp: float):
    import datetime

    return datetime.datetime.fromtimestamp(timestamp, datetime.UTC)


def report(rows, levels, audit, key_ok, key_other, upstream_tls, load_before, elapsed) -> None:
    print()
    print(
        "Load generator: stdlib Python, one thread and one connection per client "
        "(keep-alive unless 'new conn', where latency includes connect + CONNECT + TLS)."
    )
    print(
        "'direct' runs on the host (the sandbox's firewall allows only the proxy port); "
        "every proxied run comes from inside the sandbox (1 CPU quota)."
    )
    print()
    print(
        "proxy CPU: all CPU time of the proxy's processes during the run (warm-up and "
        "connection set-up included) / requests; client, upstream and PostgreSQL (all of its "
        f"processes) CPU: share of one core; host busy: share of all {os.cpu_count()} cores."
    )
    print()
    header = (
        "| mode | from | clients | req/s | median ms | p99 ms | errors "
        "| proxy CPU µs/req | client CPU | upstream CPU | PostgreSQL CPU | host busy |"
    )
    print(header)
    print("|" + " --- |" * 12)
    for row in rows:
        proxy_cpu = "—" if row["proxy_cpu"] is None else f"{row['proxy_cpu'] * 1e6:.0f}"
        print(
            f"| {row['label']} | {row['where']} | {row['concurrency']} "
            f"| {row['count'] / row['seconds']:.0f} | {ms(row['median'])} | {ms(row['p99'])} "
            f"| {row['errors']} | {proxy_cpu} | {row['client_cpu'] * 100:.0f}% "
            f"| {row['upstream_cpu'] * 100:.0f}% | {row['postgres_cpu'] * 100:.0f}% "
            f"| {row['host_busy'] * 100:.0f}% |"
        )
    by = {(r["label"], r["concurrency"]): r for r in rows}

    def rate(label, c):
        return by[(label, c)]["count"] / by[(label, c)]["seconds"]

    def ratio(label, other, c) -> str:
        return f"{rate(label, c) / rate(other, c):.2f}" if rate(other, c) else "n/a"

    def added_ms(label, other, c):
        a, b = by[(label, c)]["median"], by[(other, c)]["median"]
        return None if a is None or b is None else (a - b) * 1000

    def against_target(added) -> str:
        if added is None:
            return "n/a: no request completed within the window"
        return f"{added:+.2f} ms ({'meets' if added < 5 else 'MISSES'} the target < 5 ms)"

    print()
    for c in levels:
        tunnel = ratio("quor https tunnel", "bare https tunnel", c)
        verdict = "n/a" if tunnel == "n/a" else "meets" if float(tunnel) >= 0.7 else "MISSES"
        print(
            f"Quor/bare throughput, HTTPS tunnel, keep-alive, {c} clients: {tunnel} "
            f"({verdict} the target >= 0.7)"
        )
        print(
            f"  (for information: plain HTTP {ratio('quor http', 'bare http', c)}, tunnel with "
            "a new connection per request "
            f"{ratio('quor https tunnel, new conn', 'bare https tunnel, new conn', c)})"
        )
    for c in levels:
        note = " (the target applies here)" if c == min(levels) else " (queueing included)"
        direct = added_ms("quor https intercepted+injected", "direct https", c)
        print(
            f"Added median latency of an injected request, {c} clients{note}, against the "
            "same HTTPS request tunneled through bare proxy.py from the sandbox: "
            + against_target(added_ms("quor https intercepted+injected", "bare https tunnel", c))
            + ("" if direct is None else f"; {direct:+.2f} ms against direct from the host")
        )
    for c in levels:
        print(
            f"With a new connection per request, {c} clients, an injected request against the "
            "same request tunneled through bare proxy.py, connection set-up included: "
            + against_target(
                added_ms("quor https injected, new conn", "bare https tunnel, new conn", c)
            )
        )
    for c in levels:
        injected = by[("quor https injected, new conn", c)]["proxy_cpu"] * 1000
        tunnel = by[("quor https tunnel, new conn", c)]["proxy_cpu"] * 1000
        bare = by[("bare https tunnel, new conn", c)]["proxy_cpu"] * 1000
        print(
            f"Proxy CPU per new connection (one request each), {c} clients: intercepted and "
            f"injected {injected:.2f} ms ({'meets' if injected < 2.5 else 'MISSES'} the target "
            f"< 2.5 ms), tunnel {tunnel:.2f} ms, bare proxy.py's tunnel {bare:.2f} ms; tunnel / "
            f"bare {tunnel / bare:.2f} ({'meets' if tunnel < 1.5 * bare else 'MISSES'} the "
            "target <= 1.5)"
        )
    print(
        f"Injection check: the upstream saw the real key in {key_ok} requests and anything "
        f"else in x-api-key in {key_other}."
    )
    print(
        f"TLS handshakes of Quor's proxy with the injected upstream: {upstream_tls[0]}, "
        f"{upstream_tls[1]} of them resumed a session."
    )
    sent = {
        "forwarded": ("requests", sum(r["total"] for r in rows if r["label"] == "quor http")),
        "injected": ("requests", sum(r["total"] for r in rows if "injected" in r["label"])),
        "tunneled": (
            "connections",
            sum(r["connections"] for r in rows if r["label"].startswith("quor https tunnel")),
        ),
    }
    print(
        "Audit rows written by Quor's proxy during its runs: "
        + ", ".join(
            f"{outcome} {count}"
            + (f" (of {sent[outcome][1]} {sent[outcome][0]} sent)" if outcome in sent else "")
            for outcome, count in audit.items()
        )
    )
    print(f"Load average before the bench: {load_before:.2f}; the bench took {elapsed:.0f} s")


if __name__ == "__main__":
    main()
