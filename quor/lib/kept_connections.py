"""Database work of the web process's own async code (the runtime's progress reports,
the WebSocket viewers' reads) on a few threads that keep their connections.

Under daphne, Django's request cycle and Channels' `database_sync_to_async` open a
PostgreSQL connection for each call and close it after: about 6 ms of the host's CPU
each here (docs/performance.md), more than the statements these callers run. These
threads live as long as the process, so their connections are bounded (THREADS per web
process) and never leak."""

import functools
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import sync_to_async
from django.db import InterfaceError, OperationalError, connection

THREADS = 4
_threads = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="kept-connection")


def on_kept_connection(function):
    """`function` as a coroutine function run on one of the threads. A kept connection
    that no longer answers (PostgreSQL restarted) is replaced before the call, as
    Django's CONN_HEALTH_CHECKS does, for one round trip; one that fails during the call
    is closed, so that the next call connects again, and the error raised."""

    @functools.wraps(function)
    def on_a_working_connection(*args, **kwargs):
        if connection.connection is not None and not connection.is_usable():
            connection.close()
        try:
            return function(*args, **kwargs)
        except (OperationalError, InterfaceError):
            connection.close()
            raise

    return sync_to_async(on_a_working_connection, thread_sensitive=False, executor=_threads)
