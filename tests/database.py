"""How transactional tests empty the test database while Quor's own processes use it."""

from django.db.backends.postgresql.operations import DatabaseOperations

_truncate_sql_flush = DatabaseOperations.sql_flush

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


def sql_flush_without_deadlocks(self, style, tables, *, reset_sequences=False, allow_cascade=False):
    """Django's TRUNCATE, after taking every table's lock in one step.

    TRUNCATE locks its tables one after the other and waits, holding the earlier ones,
    for any it cannot have. The processes the tests start (web, worker, both proxies)
    query the test database at any moment, a join locking its tables in another order;
    when such a query waits for a table TRUNCATE holds while TRUNCATE waits for one of
    its, PostgreSQL ends one of them, and if that is the flush, the next test starts
    on the last one's rows ("couldn't be flushed", then an IntegrityError)."""
    statements = _truncate_sql_flush(
        self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade
    )
    if not tables:
        return statements
    names = ", ".join(self.quote_name(table) for table in tables)
    return [LOCK_EVERY_TABLE.format(tables=names), *statements]
