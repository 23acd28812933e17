#!/usr/bin/env python3
"""A new user's sandbox with the warm pool and without it, in the same run.

    flock /tmp/quor-pytest.lock .venv/bin/python bench/warm_pool.py [--runs 30]

1. Request to first successful command, as Quor's services do it for the API and the
   agent: `sandbox_ensure` for a member who has no sandbox yet, then `sandbox_exec` of
   `true`. Warm: the pool holds a ready runtime (refilled, untimed, between runs).
   Cold: the pool is empty.
2. Through the public API, as an integrator calls it: `POST /api/v1/sandbox/` with the
   member's personal token, then `GET /api/v1/sandbox/` every 5 ms until it reports
   "running"; a real daphne and a real Celery worker (queue `sandboxes`) run it.

Every run is a new member; their sandbox is destroyed after it (untimed). Prints min /
median / p99 and the targets of issue 19: warm request to first command median < 100 ms
and p99 < 300 ms; warm through the API median < 200 ms.

Own environment: database quor_bench_pool (created and migrated if missing), Redis db
11, deployment "benchpool", subnet 10.243.0.0/24, daphne on 127.0.0.1:33100, scratch
directory /tmp/quor-bench-pool. Removes its processes, sandboxes and network at the end.
"""

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    ensure_database,
    own_environment,
    p99,
    port_open,
    remove_network,
    start_process_group,
    stop_process_group,
    summary_p99,
)

WORK = Path("/tmp/quor-bench-pool")  # noqa: S108  (the bench's own scratch directory)
DATABASE = "quor_bench_pool"
WEB_PORT = 33100
POLL_S = 0.005

own_environment(
    database=DATABASE,
    redis_db=11,
    work=WORK,
    DEPLOYMENT="benchpool",
    SANDBOX_SUBNET="10.243.0.0/24",
    EGRESS_PROXY_PORT="33199",
    SANDBOX_POOL_SIZE="1",
)

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402


class Members:
    """A new member per run, in the bench's organization."""

    def __init__(self):
        from quor import services as quor_services
        from quor.models import Organization, User

        self.quor_services = quor_services
        User.objects.filter(email__endswith="@pool.bench.invalid").delete()
        self.organization = Organization.objects.filter(slug="pool-bench").first()
        self.organization = self.organization or quor_services.organization_create(
            slug="pool-bench", name="Pool bench"
        )
        self.count = 0

    def new(self):
        self.count += 1
        return self.quor_services.member_create(
            email=f"member-{self.count}-{time.time_ns()}@pool.bench.invalid",
            organization=self.organization,
        )


def prepare_pool(warm: bool) -> None:
    """One ready runtime (warm) or none (cold) before a timed run. The worker refills
    the pool after each take (its size is 1), and only one refill runs at a time: wait
    for it."""
    from sandboxes.models import PooledRuntime
    from sandboxes.runtime.pool import pool_refill

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        settings.QUOR_SANDBOX_POOL_SIZE = 1 if warm else 0
        pool_refill()
        ready = PooledRuntime.objects.filter(state=PooledRuntime.State.READY).count()
        if (ready >= 1) if warm else not PooledRuntime.objects.exists():
            return
        time.sleep(0.05)
    raise SystemExit("the pool was not ready within 60 s")


def in_process(members: Members, warm: bool) -> float:
    from sandboxes.runtime import services

    prepare_pool(warm)
    user = members.new()
    started = time.perf_counter()
    services.sandbox_ensure(user=user)
    result = services.sandbox_exec(user=user, argv=["true"])
    elapsed = time.perf_counter() - started
    if result.exit_code != 0:
        raise SystemExit(f"`true` failed: {result}")
    services.sandbox_destroy(sandbox=user.sandbox)
    return elapsed


def through_api(members: Members, warm: bool) -> float:
    from sandboxes.runtime import services

    prepare_pool(warm)
    user = members.new()
    _, token = members.quor_services.api_token_create(user=user, name="pool bench")
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    connection = http.client.HTTPConnection("127.0.0.1", WEB_PORT, timeout=60)
    started = time.perf_counter()
    connection.request("POST", "/api/v1/sandbox/", "{}", headers)
    response = connection.getresponse()
    answer = response.read()
    if response.status != 202:
        raise SystemExit(f"POST /api/v1/sandbox/ answered {response.status}: {answer[:300]!r}")
    state = json.loads(answer)["state"]
    while state != "running":
        if state == "failed" or time.perf_counter() - started > 60:
            raise SystemExit(f"the sandbox did not start: {answer[:300]!r}")
        time.sleep(POLL_S)
        connection.request("GET", "/api/v1/sandbox/", headers=headers)
        answer = connection.getresponse().read()
        state = json.loads(answer)["state"]
    elapsed = time.perf_counter() - started
    connection.close()
    user.sandbox.refresh_from_db()
    services.sandbox_destroy(sandbox=user.sandbox)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()

    from sandboxes.backends.docker import DockerBackend
    from sandboxes.models import PooledRuntime

    WORK.mkdir(parents=True, exist_ok=True)
    ensure_database(DATABASE)
    call_command("migrate", verbosity=0)
    PooledRuntime.objects.all().delete()  # an earlier run's, its runtimes removed below
    remove_network()
    subprocess.run([str(ROOT / "tools/build-sandbox-image"), "--if-missing"], check=True)  # noqa: S603
    DockerBackend().ensure_network()
    members = Members()
    web = start_process_group(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(WEB_PORT),
         "quor.asgi:application"],
        WORK / "daphne.log", cwd=ROOT,
    )  # fmt: skip
    worker = start_process_group(
        [sys.executable, "-m", "celery", "-A", "quor", "worker", "-Q", "sandboxes",
         "--concurrency", "2", "--without-gossip", "--without-mingle", "--loglevel", "WARNING"],
        WORK / "worker.log", cwd=ROOT,
    )  # fmt: skip
    samples: dict[str, list[float]] = {}
    try:
        deadline = time.monotonic() + 30
        while not port_open("127.0.0.1", WEB_PORT):
            if time.monotonic() > deadline:
                raise SystemExit(f"daphne did not start: see {WORK / 'daphne.log'}")
            time.sleep(0.1)
        in_process(members, True)  # warm-up: imports, connections, the first network
        through_api(members, False)
        for name, measure in (
            ("request -> first command", in_process),
            ("API POST -> running", through_api),
        ):
            for warm in (True, False):  # alternating runs, so both see the same machine
                samples[f"{name}, {'warm' if warm else 'cold'}"] = []
            for _ in range(args.runs):
                for warm in (True, False):
                    label = f"{name}, {'warm' if warm else 'cold'}"
                    samples[label].append(measure(members, warm))
    finally:
        stop_process_group(worker)
        stop_process_group(web)
        PooledRuntime.objects.all().delete()
        remove_network()

    print(f"image {settings.QUOR_SANDBOX_IMAGE}, {os.cpu_count()} CPUs, {args.runs} runs each")
    for label, values in samples.items():
        print(summary_p99(label, values, width=40, digits=1))
    first = samples["request -> first command, warm"]
    api = samples["API POST -> running, warm"]
    print(
        f"targets: warm request -> first command median {statistics.median(first) * 1000:.1f} "
        f"ms (< 100), p99 {p99(first) * 1000:.1f} ms (< 300); warm API median "
        f"{statistics.median(api) * 1000:.1f} ms (< 200)"
    )


if __name__ == "__main__":
    main()
