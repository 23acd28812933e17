#!/usr/bin/env python3
"""Web app proxy: throughput against the app server itself, and memory while streaming.

    .venv/bin/python bench/webapp_proxy.py [--seconds 5] [--warmup 1] [--concurrency 1,8,32]
        [--stream-mb 200] [--read-kib 64] [--read-pause-ms 4] [--profile]

Starts a real sandbox running a small app server (stdlib ThreadingHTTPServer, as the
sandbox user, `APP_SOURCE` below: `/small` answers 3 bytes, `/big?size=N` streams N
bytes), registers it as a session's web app, starts the web app proxy's own process
(`manage.py run_webapp_proxy`: `webapps.proxy` on uvloop) and gets a viewer cookie
through the real hand-off on the app's host. Quor's web process (daphne) is not
needed and not started. Then, from this host:

(a) Throughput of small responses: a stdlib load generator (its own process, one thread
    and one keep-alive connection per client) asks for `/small` straight from the app
    server (the sandbox's bridge address and port) and then through the proxy (the
    app's host on run_webapp_proxy, with the viewer cookie), at each concurrency, in the
    same run.
    Target: proxied / direct >= 0.5.
(b) Memory: one client asks through the proxy for a `--stream-mb` response and reads it
    slowly (`--read-kib` at a time, pausing `--read-pause-ms` between reads) while this
    script samples the proxy process's RSS (/proc/PID/status) every 50 ms. Target: peak growth
    over the RSS before the stream < 50 MB.

`--profile` runs the proxy under cProfile (its main thread, the event loop) and prints the
top functions by own time after the run. Prints PASS/MISS per target.

Own environment, so it never meets the test suite or other benches: database
quor_bench_webapps (created and migrated if missing, left in place), Redis db 6,
deployment "benchwebapps", subnet 10.236.0.0/24, the proxy on 127.0.0.1:30001, app
hosts `<label>.localhost:30001` (Quor's URLs name 127.0.0.1:30000, where nothing
listens: only redirects mention them), scratch directory /tmp/quor-bench-webapps (the
proxy's log is there). Removes the proxy, the sandbox and the Docker network it made.
"""

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    bench_member,
    ensure_database,
    host_cpu_times,
    ms,
    port_free,
    port_open,
    process_group_alive,
    remove_network,
)

WORK = Path("/tmp/quor-bench-webapps")  # noqa: S108  (the bench's own scratch directory)
DATABASE = "quor_bench_webapps"
DEPLOYMENT = "benchwebapps"
REDIS_URL = "redis://127.0.0.1:6379/6"
SUBNET = "10.236.0.0/24"  # 10.231-10.235 belong to other deployments and benches here
WEB_PORT = 30000  # Quor's URLs; nothing is started there
PROXY_PORT = 30001  # manage.py run_webapp_proxy
APP_PORT = 8080  # inside the sandbox
BENCH_EMAIL = "webapps-bench@bench.test"
ORG_SLUG = "webapps-bench"

# Forced, not defaulted: an inherited test or dev environment must never leak in.
os.environ.update(
    {
        "DJANGO_SETTINGS_MODULE": "quor.settings",
        "QUOR_DEBUG": "1",
        "QUOR_DEPLOYMENT": DEPLOYMENT,
        "QUOR_SANDBOX_SUBNET": SUBNET,
        "QUOR_EGRESS_PROXY_PORT": "30899",  # not started: the bench needs no egress
        "DATABASE_URL": f"postgresql:///{DATABASE}",
        "REDIS_URL": REDIS_URL,
        "QUOR_EGRESS_CA_DIR": str(WORK / "egress-ca"),
        "QUOR_SANDBOX_API_URL": f"http://127.0.0.1:{WEB_PORT}",
        "QUOR_PUBLIC_URL": f"http://127.0.0.1:{WEB_PORT}",
        "QUOR_WEBAPP_BASE_URL": f"http://localhost:{PROXY_PORT}",
        "QUOR_WEBAPP_PROXY_BIND": f"127.0.0.1:{PROXY_PORT}",
    }
)

# --- the app server, run INSIDE the sandbox (standard library only) ----------------------

APP_SOURCE = r"""
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CHUNK = b"x" * 65536


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # the head and the body are two writes

    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.path.startswith("/big"):
            size = int(self.path.split("=")[1])
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(size))
            self.end_headers()
            while size > 0:
                self.wfile.write(CHUNK[: min(size, len(CHUNK))])
                size -= len(CHUNK)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", "3")
        self.end_headers()
        self.wfile.write(b"ok\n")


ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer.request_queue_size = 1024
ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), Handler).serve_forever()
"""

# --- the load generator: its own process on the host (stdlib) ------------------------------

GENERATOR = r"""
import json, os, socket, sys, threading, time

cfg = json.loads(sys.argv[1])
address = tuple(cfg["connect"])
request = (
    f"GET {cfg['path']} HTTP/1.1\r\nHost: {cfg['host']}\r\n"
    + "".join(f"{name}: {value}\r\n" for name, value in cfg["headers"])
    + "\r\n"
).encode()


def exchange(sock, buf):
    sock.sendall(request)
    while True:
        end = buf.find(b"\r\n\r\n")
        if end >= 0:
            break
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("connection closed before a response")
        buf += chunk
    head, buf = buf[: end + 4], buf[end + 4 :]
    lower = head.lower()
    at = lower.find(b"\r\ncontent-length:")
    if at < 0:
        raise RuntimeError("no Content-Length: " + repr(head[:300]))
    length = int(lower[at + 17 : lower.find(b"\r\n", at + 2)])
    while len(buf) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("connection closed in the body")
        buf += chunk
    if head[9:12] != b"200":
        raise RuntimeError(repr(head[:300]) + " " + repr(buf[:length][:200]))
    return buf[length:]


launched = time.perf_counter()
window_start = launched + cfg["warmup"]
window_end = window_start + cfg["seconds"]
results = []


def worker():
    latencies, messages = [], []
    errors = total = opened = 0
    sock, buf = None, b""
    while time.perf_counter() < window_end:
        try:
            if sock is None:
                sock, buf = socket.create_connection(address, timeout=10), b""
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                opened += 1
            sent = time.perf_counter()
            buf = exchange(sock, buf)
            done = time.perf_counter()
            total += 1
            if sent >= window_start and done <= window_end:
                latencies.append(done - sent)
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
    results.append((latencies, errors, total, messages, opened))


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


def percentile(values, q):
    return values[min(len(values) - 1, round(q * (len(values) - 1)))] if values else None


cpu = (cpu_end.user - cpu_start.user) + (cpu_end.system - cpu_start.system)
print(json.dumps({
    "count": len(latencies),
    "seconds": cfg["seconds"],
    "median": percentile(latencies, 0.5),
    "p99": percentile(latencies, 0.99),
    "errors": sum(r[1] for r in results),
    "total": sum(r[2] for r in results),
    "connections": sum(r[4] for r in results),
    "messages": [m for r in results for m in r[3]][:5],
    "stuck_threads": sum(t.is_alive() for t in threads),
    "client_cpu": cpu / cfg["seconds"],
}), flush=True)
os._exit(0)
"""


# --- processes ------------------------------------------------------------------------------


class ProxyProcess:
    """The web app proxy (`manage.py run_webapp_proxy`) in its own process group."""

    def __init__(self, *, profile: Path | None):
        self.log = WORK / "webapp-proxy.log"
        argv = [sys.executable]
        if profile:
            argv += ["-m", "cProfile", "-o", str(profile)]
        argv += ["manage.py", "run_webapp_proxy"]
        with open(self.log, "wb") as output:
            self.process = subprocess.Popen(  # noqa: S603
                argv,
                cwd=ROOT,
                env=os.environ.copy(),
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_listening(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not port_open("127.0.0.1", PROXY_PORT):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the web app proxy did not start: see {self.log}")
            time.sleep(0.1)

    def rss(self) -> int:
        """Resident set size in bytes."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def cpu(self) -> float:
        stat = Path(f"/proc/{self.process.pid}/stat").read_text()
        fields = stat[stat.rfind(")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        deadline = time.monotonic() + 10
        while process_group_alive(self.process.pid):
            signal_number = signal.SIGTERM if time.monotonic() < deadline else signal.SIGKILL
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal_number)
            time.sleep(0.2)


def processes_cpu(name: str) -> float:
    """CPU seconds (user + system) of the live processes with this command name, plus
    what their ended children used (PostgreSQL backends that exit between two samples)."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if stat[stat.find("(") + 1 : stat.rfind(")")] == name:
            fields = stat[stat.rfind(")") + 2 :].split()
            total += sum(int(value) for value in fields[11:15])
    return total / os.sysconf("SC_CLK_TCK")


def container_cpu(runtime_id: str) -> float | None:
    """CPU seconds of the sandbox's container (cgroup v2 or v1), or None."""
    for path in (
        f"/sys/fs/cgroup/system.slice/docker-{runtime_id}.scope/cpu.stat",
        f"/sys/fs/cgroup/docker/{runtime_id}/cpu.stat",
    ):
        with contextlib.suppress(OSError):
            for line in Path(path).read_text().splitlines():
                if line.startswith("usage_usec"):
                    return int(line.split()[1]) / 1e6
    with contextlib.suppress(OSError):
        usage = Path(f"/sys/fs/cgroup/cpuacct/docker/{runtime_id}/cpuacct.usage").read_text()
        return int(usage) / 1e9
    return None


# --- set-up ---------------------------------------------------------------------------------


def setup_data():
    """The org, user, provider, sandbox and session; earlier bench sessions go."""
    from sandboxes.models import Session
    from sandboxes.runtime import services

    _, user, provider = bench_member(slug=ORG_SLUG, name="Web apps bench", email=BENCH_EMAIL)
    sandbox = services.sandbox_ensure(user=user)
    session = Session.objects.create(
        owner=user, sandbox=sandbox, model_provider=provider, model_name="claude-bench"
    )
    return user, sandbox, session


# Starts the app server in the background, then waits until it accepts connections.
START_APP = (
    'setsid python3 -c "$1" "$2" > /tmp/bench-app.log 2>&1 < /dev/null & '
    'for i in $(seq 50); do python3 -c "$3" "$2" 2>/dev/null && exit 0; sleep 0.1; done; exit 1'
)
PORT_CHECK = "import socket, sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])))"


def start_app(user) -> None:
    from sandboxes.runtime import services

    result = services.sandbox_exec(
        user=user, argv=["sh", "-c", START_APP, "sh", APP_SOURCE, str(APP_PORT), PORT_CHECK]
    )
    if result.exit_code != 0:
        raise SystemExit(f"the app server did not start in the sandbox: {result.stderr!r}")


def viewer_cookie(user, webapp) -> str:
    """Through the real hand-off on the app's host, as a browser gets it."""
    from webapps import services as webapps

    target = urlsplit(webapps.handoff_url(user, webapp))
    with socket.create_connection(("127.0.0.1", PROXY_PORT), timeout=10) as sock:
        sock.sendall(
            f"GET {target.path}?{target.query} HTTP/1.1\r\nHost: {target.netloc}\r\n"
            "Connection: close\r\n\r\n".encode()
        )
        response = b""
        while chunk := sock.recv(65536):
            response += chunk
    head = response.split(b"\r\n\r\n", 1)[0].decode("latin-1")
    for line in head.split("\r\n"):
        if line.lower().startswith("set-cookie:"):
            return line.split(":", 1)[1].strip().split(";")[0]
    raise SystemExit(f"the hand-off set no cookie: {head!r}")


# --- measuring ------------------------------------------------------------------------------


def run_generator(cfg: dict) -> dict:
    timeout = int(cfg["warmup"] + cfg["seconds"] + 40)
    result = subprocess.run(  # noqa: S603
        [sys.executable, "-c", GENERATOR, json.dumps(cfg)], capture_output=True, timeout=timeout
    )
    if result.returncode != 0:
        raise SystemExit(f"the load generator failed: {result.stderr.decode(errors='replace')}")
    return json.loads(result.stdout.decode().strip().splitlines()[-1])


def measure_throughput(args, levels, proxy, sandbox, app_host, cookie) -> list[dict]:
    targets = {
        "direct": {
            "connect": [sandbox.network_address, APP_PORT],
            "host": f"localhost:{APP_PORT}",
            "headers": [],
        },
        "proxied": {
            "connect": ["127.0.0.1", PROXY_PORT],
            "host": app_host,
            "headers": [["Cookie", cookie]],
        },
    }
    rows = []
    for concurrency in levels:
        for mode, target in targets.items():
            cfg = {
                **target,
                "path": "/small",
                "concurrency": concurrency,
                "warmup": args.warmup,
                "seconds": args.seconds,
            }
            proxy_cpu = proxy.cpu()
            app_cpu = container_cpu(sandbox.runtime_id)
            postgres_cpu = processes_cpu("postgres")
            host_before = host_cpu_times()
            started = time.monotonic()
            result = run_generator(cfg)
            wall = time.monotonic() - started
            host_after = host_cpu_times()
            app_after = container_cpu(sandbox.runtime_id)
            result.update(
                mode=mode,
                concurrency=concurrency,
                rate=result["count"] / result["seconds"],
                proxy_cpu=(proxy.cpu() - proxy_cpu) / max(result["total"], 1),
                app_cpu=None if app_cpu is None else (app_after - app_cpu) / wall,
                postgres_cpu=(processes_cpu("postgres") - postgres_cpu) / wall,
                host_busy=(host_after[0] - host_before[0]) / max(host_after[1] - host_before[1], 1),
            )
            rows.append(result)
            print(
                f"  {mode:<8} c={concurrency:<3} {result['rate']:8.0f} req/s  "
                f"median {ms(result['median'])} ms  p99 {ms(result['p99'])} ms  "
                f"errors {result['errors']}"
                + (f"  e.g. {result['messages'][0]}" if result["messages"] else ""),
                flush=True,
            )
    return rows


def measure_stream(args, proxy, app_host, cookie) -> dict:
    """One slow client reads a large response through the proxy; its RSS sampled."""
    size = args.stream_mb * 1_000_000
    samples = []
    done = threading.Event()
    outcome = {}

    def client():
        began = time.monotonic()
        received = 0
        try:
            sock = socket.create_connection(("127.0.0.1", PROXY_PORT), timeout=60)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 256 * 1024)
            sock.sendall(
                f"GET /big?size={size} HTTP/1.1\r\nHost: {app_host}\r\nCookie: {cookie}\r\n"
                "Connection: close\r\n\r\n".encode()
            )
            buf = b""
            while b"\r\n\r\n" not in buf:
                buf += sock.recv(65536)
            head, rest = buf.split(b"\r\n\r\n", 1)
            outcome["status"] = head.split(b" ", 2)[1].decode()
            outcome["first_byte"] = time.monotonic() - began
            received = len(rest)
            while True:
                chunk = sock.recv(args.read_kib * 1024)
                if not chunk:
                    break
                received += len(chunk)
                time.sleep(args.read_pause_ms / 1000)
            sock.close()
        except Exception as exc:
            outcome["error"] = repr(exc)
        outcome["received"] = received
        outcome["seconds"] = time.monotonic() - began
        done.set()

    time.sleep(1)
    before = proxy.rss()
    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    while not done.is_set():
        samples.append((time.monotonic(), proxy.rss()))
        done.wait(0.05)
    time.sleep(2)
    after = proxy.rss()
    peak = max(rss for _, rss in samples)
    return {
        **outcome,
        "size": size,
        "before": before,
        "peak": peak,
        "after": after,
        "samples": len(samples),
    }


def mb(value: int) -> str:
    return f"{value / 1e6:.1f} MB"


def report(rows, levels, stream, load_before, began) -> dict:
    print()
    print(
        "Load generator: stdlib Python on this host, its own process, one thread and one "
        "keep-alive connection per client, GET of a 3-byte body. 'direct': to the app server "
        "on the sandbox's bridge address; 'proxied': to the app's host on run_webapp_proxy "
        "with the viewer cookie. proxy CPU: its CPU time during the run (warm-up included) / "
        "requests; app CPU, PostgreSQL CPU (all its processes): share of one core; host busy: "
        f"all {os.cpu_count()} cores."
    )
    print()
    print(
        "| mode | clients | req/s | median ms | p99 ms | errors | proxy CPU µs/req "
        "| app CPU | PostgreSQL CPU | client CPU | host busy |"
    )
    print("|" + " --- |" * 11)
    for row in rows:
        proxy_cpu = "—" if row["mode"] == "direct" else f"{row['proxy_cpu'] * 1e6:.0f}"
        app_cpu = "—" if row["app_cpu"] is None else f"{row['app_cpu'] * 100:.0f}%"
        print(
            f"| {row['mode']} | {row['concurrency']} | {row['rate']:.0f} | {ms(row['median'])} "
            f"| {ms(row['p99'])} | {row['errors']} | {proxy_cpu} | {app_cpu} "
            f"| {row['postgres_cpu'] * 100:.0f}% | {row['client_cpu'] * 100:.0f}% "
            f"| {row['host_busy'] * 100:.0f}% |"
        )
    by = {(r["mode"], r["concurrency"]): r for r in rows}
    verdicts = {}
    print()
    ratios = []
    for c in levels:
        direct, proxied = by[("direct", c)]["rate"], by[("proxied", c)]["rate"]
        ratio = proxied / direct if direct else 0.0
        ratios.append(ratio)
        print(
            f"(a) proxied / direct throughput, {c} clients: {ratio:.2f} "
            f"({'PASS' if ratio >= 0.5 else 'MISS'}: target >= 0.5)"
        )
    verdicts["throughput"] = all(r >= 0.5 for r in ratios) and not any(r["errors"] for r in rows)
    if stream is not None:
        growth = stream["peak"] - stream["before"]
        ok = (
            "error" not in stream
            and stream.get("status") == "200"
            and stream["received"] == stream["size"]
        )
        rate = stream["received"] / stream["seconds"] / 1e6 if stream["seconds"] else 0
        print(
            f"(b) streaming {mb(stream['size'])} through the proxy to a slow reader: "
            f"status {stream.get('status')}, received {stream['received']} bytes in "
            f"{stream['seconds']:.1f} s ({rate:.1f} MB/s), first byte after "
            f"{ms(stream.get('first_byte'))} ms"
            + (f", error {stream['error']}" if "error" in stream else "")
        )
        print(
            f"    proxy RSS before {mb(stream['before'])}, peak {mb(stream['peak'])} "
            f"(growth {mb(growth)}), 2 s after {mb(stream['after'])}; "
            f"{stream['samples']} samples: {'PASS' if ok and growth < 50e6 else 'MISS'} "
            "(target growth < 50 MB)"
        )
        verdicts["memory"] = ok and growth < 50e6
    load_after = os.getloadavg()
    print(
        f"{os.cpu_count()} CPUs; load average before {load_before[0]:.2f}, after "
        f"{load_after[0]:.2f}; the bench took {time.monotonic() - began:.0f} s"
    )
    print("Verdicts: " + ", ".join(f"{k} {'PASS' if v else 'MISS'}" for k, v in verdicts.items()))
    return verdicts


def print_profile(path: Path, limit: int = 30) -> None:
    import pstats

    if not path.exists():
        print(f"no profile written at {path}")
        return
    print()
    print(f"the proxy's main thread (cProfile, {path}), top {limit} by own time:")
    stats = pstats.Stats(str(path))
    stats.sort_stats("tottime").print_stats(limit)
    stats.sort_stats("cumulative").print_stats(limit)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=1, help="unmeasured seconds first")
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--stream-mb", type=int, default=200, help="0: skip the memory part")
    parser.add_argument("--read-kib", type=int, default=64, help="slow reader: bytes per read")
    parser.add_argument("--read-pause-ms", type=float, default=4, help="slow reader: pause")
    parser.add_argument("--profile", action="store_true", help="the proxy under cProfile")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
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
    if not port_free(PROXY_PORT):
        raise SystemExit(f"port {PROXY_PORT} is in use here: another run?")

    WORK.mkdir(parents=True, exist_ok=True)
    ensure_database(DATABASE)

    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from django.db import connections

    from sandboxes.runtime import services
    from webapps import services as webapps

    profile = WORK / "webapp-proxy.prof" if args.profile else None
    if profile and profile.exists():
        profile.unlink()
    proxy = sandbox = None
    cleanup = []
    stream = None
    try:
        user, sandbox, session = setup_data()
        print(f"sandbox {sandbox.pk} at {sandbox.network_address}", flush=True)
        start_app(user)
        webapp = webapps.webapp_register(session=session, port=APP_PORT, command="bench app")
        connections.close_all()
        proxy = ProxyProcess(profile=profile)
        proxy.wait_listening()
        app_host = urlsplit(webapps.app_origin().origin(webapp.label)).netloc
        cookie = viewer_cookie(user, webapp)
        print(
            f"run_webapp_proxy (pid {proxy.process.pid}) serves the app at http://{app_host}/",
            flush=True,
        )

        print("(a) throughput, /small (3 bytes):", flush=True)
        rows = measure_throughput(args, levels, proxy, sandbox, app_host, cookie)
        if args.stream_mb:
            print(
                f"(b) streaming {args.stream_mb} MB to a reader of {args.read_kib} KiB every "
                f"{args.read_pause_ms} ms:",
                flush=True,
            )
            stream = measure_stream(args, proxy, app_host, cookie)
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
        try:
            cleanup.append(remove_network())
        except Exception as exc:
            cleanup.append(f"network NOT removed: {exc!r}")
        print("cleanup: " + "; ".join(cleanup), flush=True)

    report(rows, levels, stream, load_before, began)
    if profile:
        print_profile(profile)


if __name__ == "__main__":
    main()
