"""Transactional tests empty the test database while other processes query it."""

import threading
import time

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection, connections
from psycopg import sql

pytestmark = pytest.mark.django_db(transaction=True)


def test_emptying_the_database_waits_for_a_reader_instead_of_deadlocking_with_it():
    """Another connection reads the last table the flush names, then the first one, in
    one transaction, while the flush runs: plain TRUNCATE holds the first table and
    waits for the last, and PostgreSQL ends one of the two as a deadlock."""
    tables = connection.introspection.django_table_names(only_existing=True, include_views=False)
    read_first, read_last = (
        sql.SQL("SELECT 1 FROM {} LIMIT 1").format(sql.Identifier(name))
        for name in (tables[0], tables[-1])
    )
    settings = connection.get_connection_params()
    outcome = {}

    def flush():
        try:
            call_command("flush", interactive=False, verbosity=0)
            outcome["flush"] = "done"
        except Exception as exc:
            outcome["flush"] = repr(exc)
        finally:
            connections.close_all()

    with psycopg.connect(**settings) as reader:
        reader.execute(read_last)  # in a transaction, holding its lock
        flushing = threading.Thread(target=flush)
        flushing.start()
        time.sleep(0.5)  # the flush has reached the last table
        reader.execute(read_first)
        time.sleep(1.5)  # past PostgreSQL's deadlock_timeout (1 s)
        reader.commit()
    flushing.join(timeout=30)
    assert outcome == {"flush": "done"}
