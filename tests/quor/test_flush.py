"""Transactional tests empty the test database while other processes query it."""

import threading
import time

import psycopg
import pytest
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.core.management import call_command
from django.db import connection, connections
from django.db.models.signals import post_migrate
from psycopg import sql

from tests.database import KEPT_TABLES, emit_post_migrate_signal_unless_kept

pytestmark = pytest.mark.django_db(transaction=True)


def test_emptying_the_database_waits_for_a_reader_instead_of_deadlocking_with_it():
    """Another connection reads the last table the flush names, then the first one, in
    one transaction, while the flush runs: a flush that locks its tables one after the
    other (as TRUNCATE does) holds the first table and waits for the last, and
    PostgreSQL ends one of the two as a deadlock."""
    tables = [
        table
        for table in connection.introspection.django_table_names(
            only_existing=True, include_views=False
        )
        if table not in KEPT_TABLES
    ]
    read_first, read_last = (
        sql.SQL("SELECT 1 FROM {} LIMIT 1").format(sql.Identifier(name))
        for name in (tables[0], tables[-1])
    )
    settings = connection.get_connection_params()
    outcome = {}

    def flush():
        try:
            # As a transactional test's teardown flushes (TransactionTestCase).
            call_command("flush", interactive=False, verbosity=0, reset_sequences=False)
            outcome["flush"] = "done"
        except Exception as exc:
            outcome["flush"] = repr(exc)
        finally:
            connections.close_all()

    with psycopg.connect(**settings) as reader, psycopg.connect(**settings) as watcher:
        watcher.autocommit = True
        reader.execute(read_last)  # in a transaction, holding its lock
        flushing = threading.Thread(target=flush)
        flushing.start()
        wait_until_the_flush_waits_for_a_lock(watcher, reader)
        reader.execute(read_first)
        time.sleep(1.5)  # past PostgreSQL's deadlock_timeout (1 s)
        reader.commit()
    flushing.join(timeout=90)  # longer than the flush's own 60 s limit
    assert outcome == {"flush": "done"}


def wait_until_the_flush_waits_for_a_lock(watcher, reader, timeout=30):
    """The flush has reached the table the reader holds: the lock-everything loop
    sleeping between tries (or waiting for a lock, were it to lock table by table)."""
    reader_pid = reader.info.backend_pid
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        waiting = watcher.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE pid <> %s AND pid <> pg_backend_pid() "
            "AND datname = current_database() "
            "AND query LIKE '%%LOCK TABLE%%' "
            "AND (wait_event_type = 'Lock' OR wait_event = 'PgSleep')",
            [reader_pid],
        ).fetchone()[0]
        if waiting:
            return
        time.sleep(0.02)
    raise AssertionError("the flush never waited for the reader's table")


def test_a_flush_that_keeps_the_content_types_sends_no_post_migrate():
    sent = []

    def record(**kwargs):
        sent.append(kwargs["using"])

    post_migrate.connect(record, dispatch_uid="test-flush-record")
    try:
        call_command("flush", interactive=False, verbosity=0, reset_sequences=False)
    finally:
        post_migrate.disconnect(dispatch_uid="test-flush-record")
    assert sent == []
    assert ContentType.objects.filter(app_label="knowledge").exists()


@pytest.mark.django_db(transaction=False)
def test_post_migrate_is_sent_after_a_flush_that_emptied_the_content_types():
    with connection.cursor() as cursor:  # rolled back with the test
        cursor.execute("DELETE FROM auth_permission")
        cursor.execute("DELETE FROM django_content_type")
    ContentType.objects.clear_cache()
    try:
        emit_post_migrate_signal_unless_kept(0, False, "default")
        assert ContentType.objects.filter(app_label="knowledge").exists()
        assert Permission.objects.filter(codename="view_knowledgedocument").exists()
    finally:
        ContentType.objects.clear_cache()  # of ids that roll back with the test
