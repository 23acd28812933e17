"""Real Quor processes for the metrics and logging tests, each on ports of its own so
that they run beside the session's shared processes, and what they serve and write."""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]


class Processes:
    """Starts processes in their own process groups (pool children and acceptors
    included) and stops every one of them."""

    def __init__(self, env: dict, logs: Path):
        self.env = env
        self.logs = logs
        self.started = []

    def start(self, name: str, argv: list[str], **env: str) -> Path:
        """Starts argv from the checkout with `env` added; returns the path of its output."""
        log = self.logs / f"{name}.log"
        with open(log, "wb") as output:
            self.started.append(
                subprocess.Popen(
                    argv, cwd=ROOT, env={**self.env, **env}, stdout=output,
                    stderr=subprocess.STDOUT, start_new_session=True,
                )
            )  # fmt: skip
        return log

    def stop_all(self) -> None:
        for process in self.started:
            for sig, grace in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
                try:
                    os.killpg(process.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    process.wait(timeout=grace)
                    break
                except subprocess.TimeoutExpired:
                    continue


def web(port: int) -> list[str]:
    """Quor's web tier as deployed: two daphne processes on one socket."""
    return [sys.executable, "manage.py", "serve_web", "--port", str(port), "--processes", "2"]


def celery_worker(queue: str) -> list[str]:
    return [sys.executable, "-m", "celery", "-A", "quor", "worker", "-Q", queue,
            "--pool", "prefork", "--concurrency", "2", "--without-gossip", "--without-mingle",
            "--loglevel", "INFO"]  # fmt: skip


def scrape(port: int) -> dict:
    """Every sample the process serves: {(name, frozenset(labels)): value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def sample(samples: dict, name: str, **labels) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def eventually(port: int, name: str, expected: float, **labels) -> dict:
    """Scrapes until the sample has the expected value (30 s at most)."""
    deadline = time.monotonic() + 30
    while True:
        samples = scrape(port)
        if sample(samples, name, **labels) == expected or time.monotonic() > deadline:
            return samples
        time.sleep(0.2)


def json_lines(log: Path) -> list[dict]:
    """The log lines of the process's output (not Celery's banner, not what a command
    prints for its operator), each of which must be one JSON object."""
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
