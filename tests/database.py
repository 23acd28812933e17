"""How transactional tests empty the test database while Quor's own processes use it."""

from django.core.management.commands import flush
from django.db import connections
from django.db.backends.postgresql.operations import DatabaseOperations

_truncate_sql_flush = DatabaseOperations.sql_flush
_emit_post_migrate_signal = flush.emit_post_migrate_signal

# Takes every table's lock at once or none: a NOWAIT that fails rolls its subtransaction
# back (releasing what it had taken), waits a moment and tries again.
LOCK_EVERY_TABLE = """
DO $$
DECLARE
    deadline timestamptz := clock_timestamp() + interval '60 seconds';
BEGIN
    LOOP
        BEGIN
            LOCK TABLE {tables} IN ACCESS EXCLUSIVE MODE NOWAIT;
            RETURN;
        EXCEPTION WHEN lock_not_available THEN
            IF clock_timestamp() > deadline THEN
                RAISE;
            END IF;
            PERFORM pg_sleep(0.02);
        END;
    END LOOP;
END $$;
"""


# Written by migrate and never by a test: kept, so that the flush's post_migrate signal
# finds them and has nothing to recreate (and other processes' caches of their ids hold).
KEPT_TABLES = {"django_content_type", "auth_permission"}


def sql_flush_without_deadlocks(self, style, tables, *, reset_sequences=False, allow_cascade=False):
    """Every table emptied with DELETE, after taking every table's lock in one step.

    TRUNCATE locks its tables one after the other and waits, holding the earlier ones,
    for any it cannot have. The processes the tests start (web, worker, both proxies)
    query the test database at any moment, a join locking its tables in another order;
    when such a query waits for a table TRUNCATE holds while TRUNCATE waits for one of
    its, PostgreSQL ends one of them, and if that is the flush, the next test starts
    on the last one's rows ("couldn't be flushed", then an IntegrityError).

    DELETE rather than TRUNCATE: a test leaves a few rows, and TRUNCATE makes new files
    for every table and index (0.6 s for Quor's tables here, against a few milliseconds).
    Django's foreign keys are deferred, so the order of the tables does not matter."""
    # Resetting sequences, or emptying some apps' tables (available_apps), needs TRUNCATE's
    # RESTART IDENTITY and CASCADE; a test's teardown asks neither. (A test marked
    # reset_sequences would also need the kept tables' sequences left alone.)
    if reset_sequences or allow_cascade:
        emptied = tables
        statements = _truncate_sql_flush(
            self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade
        )
    else:
        emptied = [table for table in tables if table not in KEPT_TABLES]
        statements = [
            "SET CONSTRAINTS ALL DEFERRED",
            *(f"DELETE FROM {self.quote_name(table)}" for table in emptied),  # noqa: S608 (quoted names)
        ]
    if not emptied:
        return []
    names = ", ".join(self.quote_name(table) for table in emptied)
    return [LOCK_EVERY_TABLE.format(tables=names), *statements]


def emit_post_migrate_signal_unless_kept(verbosity, interactive, database, **kwargs):
    """post_migrate after a flush, unless the flush kept what it writes: its receivers
    (content types and permissions) would read every model's rows to create nothing,
    about 0.1 s of every transactional test's teardown."""
    with connections[database].cursor() as cursor:
        cursor.execute(
            "SELECT EXISTS (SELECT FROM django_content_type)"
            " AND EXISTS (SELECT FROM auth_permission)"
        )
        (kept,) = cursor.fetchone()
    if not kept:
        _emit_post_migrate_signal(verbosity, interactive, database, **kwargs)
