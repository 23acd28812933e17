#!/usr/bin/env python3
"""Sandbox lifecycle timings on this machine, through the Docker backend.

    .venv/bin/python bench/sandbox_lifecycle.py [--runs 10] [--execs 200]

Measures cold ensure (no container) to first successful exec, warm exec round trip
(`true`), and destroy; prints min / median / p95 of each. Uses its own deployment
label ("bench") and removes everything it creates.
"""

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "quor.settings")
os.environ["QUOR_DEPLOYMENT"] = "bench"
os.environ.setdefault("QUOR_SANDBOX_SUBNET", "10.233.0.0/24")
os.environ.setdefault("QUOR_DEBUG", "1")

import django

django.setup()

from django.conf import settings  # noqa: E402

from sandboxes.backends.docker import DockerBackend  # noqa: E402
from sandboxes.runtime.pool import runtime_spec  # noqa: E402


def summary(name: str, samples: list[float]) -> str:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return (
        f"{name:<28} n={len(samples):<4} min={ordered[0] * 1000:8.1f} ms  "
        f"median={statistics.median(ordered) * 1000:8.1f} ms  p95={p95 * 1000:8.1f} ms"
    )


def run_true(backend: DockerBackend, sandbox_id: str) -> None:
    result = backend.exec(
        sandbox_id, ["true"], cwd="/workspace", env={}, timeout_s=30, output_limit=1024
    )
    if result.exit_code != 0:
        raise SystemExit(f"`true` failed: {result}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--execs", type=int, default=200)
    args = parser.parse_args()

    backend = DockerBackend()
    backend.ensure_network()
    cold, warm, destroy = [], [], []
    for _ in range(args.runs):
        sandbox_id = str(uuid.uuid4())
        try:
            started = time.perf_counter()
            backend.ensure(runtime_spec(sandbox_id))
            run_true(backend, sandbox_id)
            cold.append(time.perf_counter() - started)
            for _ in range(args.execs // args.runs):
                started = time.perf_counter()
                run_true(backend, sandbox_id)
                warm.append(time.perf_counter() - started)
        finally:
            started = time.perf_counter()
            backend.destroy(sandbox_id, remove_workspace=True)
            destroy.append(time.perf_counter() - started)
    print(f"image {settings.QUOR_SANDBOX_IMAGE}, {os.cpu_count()} CPUs")
    print(summary("cold ensure -> first exec", cold))
    print(summary("warm exec (true)", warm))
    print(summary("destroy", destroy))


if __name__ == "__main__":
    main()
