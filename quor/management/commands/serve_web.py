"""Quor's web tier in production: one listening socket, QUOR_WEB_PROCESSES daphne
processes accepting on it.

daphne runs one event loop, so one process uses at most one core, and under fifty busy
sessions that core is what saturates first (docs/performance.md). The kernel hands each
new connection (a page, an API call, a WebSocket, a runtime report) to whichever process
accepts it first; a runtime report stored in one process reaches viewers in another
through the channel layer (Redis), so any process serves any session."""

import logging
import signal
import socket
import subprocess
import sys
import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from quor.lib import metrics
from quor.monitoring import DatabaseGauges

logger = logging.getLogger(__name__)

YOUNG_SECONDS = 10  # a process that exits sooner did not start well
RESTART_PAUSE_SECONDS = 1  # before replacing a young one, so that a crash loop idles
GIVE_UP_AFTER = 5  # young exits in a row: the launcher exits and its supervisor sees it
STOP_SECONDS = 15  # for the processes to end after SIGTERM, then SIGKILL


class Command(BaseCommand):
    help = (
        "Serve Quor (Django, the API, WebSockets, runtime reports) with QUOR_WEB_PROCESSES "
        "daphne processes on one socket; a process that exits is started again."
    )

    def add_arguments(self, parser):
        parser.add_argument("--bind", default="127.0.0.1", help="IPv4 address to listen on")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--processes", type=int, default=settings.QUOR_WEB_PROCESSES)

    def handle(self, *args, bind, port, processes, **options):
        if processes < 1:
            raise CommandError(f"--processes must be at least 1, not {processes}")
        if ":" in bind or "[" in bind:
            # daphne adopts an inherited socket as IPv4 only (Twisted's fd endpoint).
            raise CommandError(f"--bind takes an IPv4 address, not {bind}")
        try:
            listener = socket.create_server((bind, port), backlog=socket.SOMAXCONN)
        except OSError as exc:
            raise CommandError(f"cannot listen on {bind}:{port}: {exc.strerror}") from exc
        listener.set_inheritable(True)
        if settings.QUOR_METRICS_PORT:  # the sum of the processes' metrics, served from here
            metrics.serve_multiprocess(settings.QUOR_METRICS_PORT, collectors=[DatabaseGauges()])
        connections.close_all()
        web = WebProcesses(listener, processes)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, lambda *_: web.stop())
        logger.info("web: %d daphne processes on %s:%d", processes, bind, port)
        if not web.run():
            raise CommandError(f"daphne processes exited {GIVE_UP_AFTER} times in a row at start")


class WebProcesses:
    """Keeps `count` daphne processes running on `listener` until stop()."""

    def __init__(self, listener: socket.socket, count: int):
        self.listener = listener
        self.count = count
        self.stopping = False
        self.young_exits = 0
        self.processes: list[tuple[subprocess.Popen, float]] = []

    def start_one(self) -> tuple[subprocess.Popen, float]:
        fd = self.listener.fileno()
        argv = [sys.executable, "-m", "daphne", "--fd", str(fd)]
        # daphne's own access log (full URLs, not JSON) off: Quor's middleware logs access.
        argv += ["--access-log", "/dev/null", "quor.asgi:application"]
        process = subprocess.Popen(argv, pass_fds=[fd], cwd=settings.BASE_DIR)  # noqa: S603
        return process, time.monotonic()

    def run(self) -> bool:
        """False if the processes kept exiting as they started (the application does
        not load, for instance): restarting them for ever would hide it."""
        self.processes = [self.start_one() for _ in range(self.count)]
        while not self.stopping:
            for number, (process, started) in enumerate(self.processes):
                if process.poll() is None:
                    if time.monotonic() - started >= YOUNG_SECONDS:
                        self.young_exits = 0
                    continue
                metrics.forget_process(process.pid)
                logger.warning(
                    "web: daphne process %d exited with %d", process.pid, process.returncode
                )
                if time.monotonic() - started < YOUNG_SECONDS:
                    self.young_exits += 1
                    if self.young_exits >= GIVE_UP_AFTER:
                        self.stopping = True
                        break
                    time.sleep(RESTART_PAUSE_SECONDS)
                if not self.stopping:
                    self.processes[number] = self.start_one()
            time.sleep(0.2)
        self._stop_all()
        return self.young_exits < GIVE_UP_AFTER

    def stop(self) -> None:
        self.stopping = True

    def _stop_all(self) -> None:
        self.listener.close()  # new connections are refused, not left in the backlog
        for process, _ in self.processes:
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + STOP_SECONDS
        for process, _ in self.processes:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
