"""PostgreSQL advisory locks: work serialised across processes and machines, released
with the connection when a process dies."""

from contextlib import contextmanager

from django.db import connection


@contextmanager
def advisory_lock(name: str):
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(hashtext(%s))", [name])
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(hashtext(%s))", [name])


@contextmanager
def advisory_try_lock(name: str):
    """Like advisory_lock, but yields False at once when someone holds it."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(hashtext(%s))", [name])
        locked = cursor.fetchone()[0]
    try:
        yield locked
    finally:
        if locked:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(hashtext(%s))", [name])
