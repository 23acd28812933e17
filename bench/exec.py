#!/usr/bin/env python3
"""Exec and file transfer through Quor's exec channel, beside `docker exec` and `docker cp`
in the same run.

    flock /tmp/quor-pytest.lock .venv/bin/python bench/exec.py [--execs 300] [--downloads 3]

1. At the backend: `true` through the sandbox's exec channel (DockerBackend.exec), through
   `docker exec` by the Docker SDK (the backend's fallback: exec_create, exec_start,
   exec_inspect), and through the `docker exec` command line, alternating, one sandbox.
2. Through the public API, as an integrator calls it: POST
   /api/v1/sessions/<id>/exec/ with `["true"]` and a personal API token, on one kept-alive
   HTTP connection to a real daphne (the session row is made here: the API makes one only
   with a first message for a model).
3. A 100 MB file (random bytes) read out of the sandbox: through the channel
   (DockerBackend.read_file, the API's file download reads it so), through `docker cp`
   (a tar stream on stdout, read and thrown away), and through the API's
   GET /api/v1/sessions/<id>/files/content.

Prints min / median / p99 and the targets of issue 19: exec through the channel median
< 10 ms and p99 < 30 ms; through the API at most half of `docker exec`'s median; the
download at least 0.7 of `docker cp`'s throughput.

Own environment: database quor_bench_exec (created and migrated if missing), Redis db 10,
deployment "benchexec", subnet 10.242.0.0/24, daphne on 127.0.0.1:33000, scratch
directory /tmp/quor-bench-exec. Removes its processes, sandbox and network at the end.
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
    bench_member,
    ensure_database,
    own_environment,
    p99,
    port_open,
    remove_network,
    start_process_group,
    stop_process_group,
    summary_p99,
)

WORK = Path("/tmp/quor-bench-exec")  # noqa: S108  (the bench's own scratch directory)
DATABASE = "quor_bench_exec"
WEB_PORT = 33000
BIG_FILE_MB = 100

own_environment(
    database=DATABASE,
    redis_db=10,
    work=WORK,
    DEPLOYMENT="benchexec",
    SANDBOX_SUBNET="10.242.0.0/24",
    EGRESS_PROXY_PORT="33899",
)

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402

from sandboxes.backends.docker import DockerBackend  # noqa: E402
from sandboxes.backends.execution import run_bounded  # noqa: E402


def timed(call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def check(result) -> None:
    if result.exit_code != 0:
        raise SystemExit(f"a command failed: {result}")


def backend_execs(backend: DockerBackend, sandbox_id: str, count: int) -> dict[str, list[float]]:
    name = backend.container_name(sandbox_id)
    over_sdk = backend._runtime_starter(name)
    limits = {"cwd": "/workspace", "env": {}, "timeout_s": 30, "output_limit": 1024}
    samples = {"channel": [], "docker exec (SDK)": [], "docker exec (CLI)": []}
    for _ in range(count):
        samples["channel"].append(
            timed(lambda: check(backend.exec(sandbox_id, ["true"], **limits)))
        )
        samples["docker exec (SDK)"].append(
            timed(lambda: check(run_bounded(over_sdk, ["true"], **limits)))
        )
        samples["docker exec (CLI)"].append(
            timed(
                lambda: subprocess.run(  # noqa: S603
                    ["docker", "exec", "-u", "1000", name, "true"],  # noqa: S607
                    check=True,
                )
            )
        )
    return samples


def api_execs(session_id: str, token: str, count: int) -> list[float]:
    connection = http.client.HTTPConnection("127.0.0.1", WEB_PORT, timeout=60)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    body = json.dumps({"argv": ["true"]})
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        connection.request("POST", f"/api/v1/sessions/{session_id}/exec/", body, headers)
        response = connection.getresponse()
        answer = response.read()
        samples.append(time.perf_counter() - started)
        if response.status != 200 or json.loads(answer)["exit_code"] != 0:
            raise SystemExit(f"API exec failed: {response.status} {answer[:300]!r}")
    connection.close()
    return samples


def drain(chunks) -> int:
    return sum(len(chunk) for chunk in chunks)


def downloads(backend, sandbox_id, session_dir, session_id, token, count) -> dict:
    name = backend.container_name(sandbox_id)
    relpath = "big.bin"
    make_big_file = ["sh", "-c", f"head -c {BIG_FILE_MB << 20} /dev/urandom > {relpath}"]
    limits = {"cwd": session_dir, "env": {}, "timeout_s": 120, "output_limit": 4096}
    check(backend.exec(sandbox_id, make_big_file, **limits))
    size = BIG_FILE_MB << 20

    def channel():
        assert drain(backend.read_file(sandbox_id, session_dir, relpath)) == size

    def docker_cp():
        process = subprocess.Popen(  # noqa: S603
            ["docker", "cp", f"{name}:{session_dir}/{relpath}", "-"],  # noqa: S607
            stdout=subprocess.PIPE,
        )
        total = drain(iter(lambda: process.stdout.read(1 << 20), b""))
        assert process.wait() == 0 and total > size

    def api():
        connection = http.client.HTTPConnection("127.0.0.1", WEB_PORT, timeout=120)
        connection.request(
            "GET",
            f"/api/v1/sessions/{session_id}/files/content?path={relpath}",
            headers={"Authorization": f"Bearer {token}"},
        )
        response = connection.getresponse()
        total = drain(iter(lambda: response.read(1 << 20), b""))
        assert response.status == 200 and total == size, (response.status, total)
        connection.close()

    samples = {"channel (read_file)": [], "docker cp": [], "API files/content": []}
    for _ in range(count):
        samples["channel (read_file)"].append(timed(channel))
        samples["docker cp"].append(timed(docker_cp))
        samples["API files/content"].append(timed(api))
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--execs", type=int, default=300)
    parser.add_argument("--downloads", type=int, default=3)
    args = parser.parse_args()

    from quor import services as quor_services
    from sandboxes.models import Sandbox, Session
    from sandboxes.runtime import services

    WORK.mkdir(parents=True, exist_ok=True)
    ensure_database(DATABASE)
    call_command("migrate", verbosity=0)
    _, user, provider = bench_member(
        slug="exec-bench", name="Exec bench", email="exec-bench@bench.invalid"
    )
    Sandbox.objects.filter(user=user).delete()  # an earlier run's, its runtime removed
    _, token = quor_services.api_token_create(user=user, name=f"bench {time.time():.0f}")
    subprocess.run([str(ROOT / "tools/build-sandbox-image"), "--if-missing"], check=True)  # noqa: S603
    web = start_process_group(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(WEB_PORT),
         "quor.asgi:application"],
        WORK / "daphne.log", cwd=ROOT,
    )  # fmt: skip
    backend = DockerBackend()
    try:
        sandbox = services.sandbox_ensure(user=user)
        session = Session.objects.create(
            owner=user, sandbox=sandbox, model_provider=provider,
            model_name=provider.model_names[0], status=Session.Status.WAITING, title="bench",
        )  # fmt: skip
        session_dir = services.session_workspace_ensure(session=session)
        deadline = time.monotonic() + 30
        while not port_open("127.0.0.1", WEB_PORT):
            if time.monotonic() > deadline:
                raise SystemExit(f"daphne did not start: see {WORK / 'daphne.log'}")
            time.sleep(0.1)
        sandbox_id = sandbox.backend_sandbox_id
        api_execs(str(session.pk), token, 10)  # warm-up: imports, connections
        at_backend = backend_execs(backend, sandbox_id, args.execs)
        through_api = api_execs(str(session.pk), token, args.execs)
        transfers = downloads(
            backend, sandbox_id, session_dir, str(session.pk), token, args.downloads
        )
    finally:
        stop_process_group(web)
        remove_network()

    print(f"image {settings.QUOR_SANDBOX_IMAGE}, {os.cpu_count()} CPUs, {args.execs} execs each")
    for name, samples in at_backend.items():
        print(summary_p99(f"exec `true`, {name}", samples))
    print(summary_p99("exec `true`, API (keep-alive)", through_api))
    docker_median = statistics.median(at_backend["docker exec (CLI)"])
    channel = at_backend["channel"]
    print(
        f"targets: channel median {statistics.median(channel) * 1000:.2f} ms (< 10), "
        f"p99 {p99(channel) * 1000:.2f} ms (< 30); API median / docker exec (CLI) median "
        f"{statistics.median(through_api) / docker_median:.2f} (<= 0.5)"
    )
    rates = {}
    for name, samples in transfers.items():
        rates[name] = BIG_FILE_MB / statistics.median(samples)
        print(f"{BIG_FILE_MB} MB download, {name:<22} median {rates[name]:7.1f} MB/s  "
              f"(runs: {', '.join(f'{s:.2f} s' for s in samples)})")  # fmt: skip
    print(
        f"targets: channel / docker cp {rates['channel (read_file)'] / rates['docker cp']:.2f} "
        f"(>= 0.7); API / docker cp {rates['API files/content'] / rates['docker cp']:.2f}"
    )


if __name__ == "__main__":
    main()
