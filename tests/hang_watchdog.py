"""A test that hangs ends the run within minutes, saying where everything stood.

Without it a hang (a lock no one releases, a wait with no timeout) runs until CI's own
limit kills the run and prints nothing about the cause. After QUOR_TEST_HANG_SECONDS of
one test (setup, call and teardown together), this prints every thread's stack, what
each connection to the test database is doing and waiting for, the processes the
tests started and the ends of their logs, then ends its test process with status 3 (an
xdist worker's end fails the test and the run). It ends with a summary of a few lines
(the test, where its threads wait, the database's waits), since CI may show only the
end of the output."""

import asyncio
import faulthandler
import gc
import os
import subprocess
import sys
import threading
import traceback
from pathlib import Path

import pytest

from tests.environment import RUN_DIR

DEFAULT_HANG_SECONDS = 600

ACTIVITY_SQL = """
SELECT pid, application_name, state, wait_event_type, wait_event,
       pg_blocking_pids(pid) AS blocked_by, now() - xact_start AS in_transaction,
       left(query, 200) AS query
FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()
"""
WAITS_SQL = """
SELECT pid || ' ' || application_name || ' ' || state || ' waits ' || wait_event
       || ' blocked by ' || pg_blocking_pids(pid)::text || ': ' || left(query, 80)
FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()
  AND (wait_event_type = 'Lock' OR state = 'idle in transaction')
"""
SUMMARY_FRAMES = 4


def _print_diagnostics(out, nodeid: str, seconds: int) -> None:
    out.write(f"\n\nhang watchdog: {nodeid} still runs after {seconds} s\n")
    out.write("\n--- the stacks of this process's threads ---\n")
    out.flush()
    faulthandler.dump_traceback(file=out, all_threads=True)
    _print_asyncio_tasks(out)
    out.write("\n--- connections to the test database ---\n")
    out.flush()
    from django.conf import settings

    test_database = settings.DATABASES["default"]["NAME"]  # pytest-django renamed it
    for command in (
        ["psql", "-X", "-d", test_database, "-c", ACTIVITY_SQL],
        ["ps", "-o", "pid,ppid,etime,args", "--ppid", str(os.getpid())],
    ):
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=20)
            out.write(result.stdout + result.stderr)
        except (OSError, subprocess.TimeoutExpired) as error:
            out.write(f"{command[0]} failed: {error}\n")
    for log in sorted(RUN_DIR.glob("*.log")):
        out.write(f"\n--- the end of {log} ---\n")
        out.write("\n".join(log.read_text(errors="replace").splitlines()[-30:]) + "\n")
    out.flush()


def _print_summary(out, nodeid: str, seconds: int) -> None:
    """The few lines that say what hung: the innermost frames of each thread that is
    not idle in a pool, and the database's lock waits and open transactions."""
    out.write(f"\nhang watchdog summary: {nodeid} still ran after {seconds} s\n")
    for thread_id, frame in sys._current_frames().items():
        frames = traceback.extract_stack(frame)[-SUMMARY_FRAMES:]
        if thread_id == threading.get_ident() or any(f.name == "_worker" for f in frames):
            continue
        where = " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in frames[::-1])
        out.write(f"  thread {thread_id}: {where}\n")
    from django.conf import settings

    try:
        result = subprocess.run(
            ["psql", "-X", "-At", "-d", settings.DATABASES["default"]["NAME"], "-c", WAITS_SQL],
            capture_output=True, text=True, timeout=20,
        )  # fmt: skip
        lines = (result.stdout + result.stderr).splitlines()[:6]
    except (OSError, subprocess.TimeoutExpired) as error:
        lines = [f"psql failed: {error}"]
    for line in lines:
        out.write(f"  database: {line}\n")
    out.flush()


def _print_asyncio_tasks(out) -> None:
    """Where each coroutine of a running event loop waits: a thread's stack shows only
    the loop's select()."""
    for loop in [o for o in gc.get_objects() if isinstance(o, asyncio.AbstractEventLoop)]:
        if not loop.is_running():
            continue
        out.write(f"\n--- the tasks of event loop {loop!r} ---\n")
        try:
            tasks = list(asyncio.all_tasks(loop))
        except RuntimeError as error:  # the loop's thread changed its task set meanwhile
            out.write(f"the tasks could not be listed: {error}\n")
            continue
        for task in tasks:
            task.print_stack(file=out)
    out.flush()


def _end_run(item, seconds: int) -> None:
    """Ends the run whatever the diagnostics meet (a failure there must not leave the
    hang running), with the summary last, or at least the test's name. It writes to a
    copy of the real standard error: the test's thread may move on meanwhile and start
    capturing fd 2 again, which would swallow what follows."""
    out = sys.__stderr__
    try:
        capture = item.config.pluginmanager.getplugin("capturemanager")
        if capture is not None:
            capture.suspend_global_capture(in_=True)
        out = os.fdopen(os.dup(2), "w")
        for step in (_print_diagnostics, _print_summary):
            try:
                step(out, item.nodeid, seconds)
            except Exception:
                traceback.print_exc(file=out)
                out.flush()
                faulthandler.dump_traceback(file=out, all_threads=True)
    finally:
        out.write(f"\nhang watchdog: ended the test process in {item.nodeid}\n")
        out.flush()
        os._exit(3)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    seconds = int(os.environ.get("QUOR_TEST_HANG_SECONDS", DEFAULT_HANG_SECONDS))
    timer = threading.Timer(seconds, _end_run, args=(item, seconds))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
