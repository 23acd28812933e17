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


# --- one migrated template, a copy of it for each test process -----------------------

TEMPLATE_PREFIX = "test_quor_template_"
# pg_advisory_lock's key while a template is looked for or built: one process builds it,
# the others wait and copy it.
TEMPLATE_LOCK = 40_2026_12_07


def schema_fingerprint() -> str:
    """What the migrated schema depends on: Django's version, the installed apps and every
    migration file. A template is used only by runs with the same fingerprint."""
    import hashlib
    import importlib.util
    from pathlib import Path

    import django
    from django.apps import apps

    digest = hashlib.sha256(django.get_version().encode())
    for app in apps.get_app_configs():
        digest.update(app.label.encode())
        spec = importlib.util.find_spec(f"{app.name}.migrations")
        if spec is None or not spec.submodule_search_locations:
            continue
        for path in sorted(Path(spec.submodule_search_locations[0]).glob("*.py")):
            digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()[:16]


def test_database_create() -> str:
    """This process's test database (pytest-django's name: `test_quor`, `test_quor_gw0`,
    ...), made afresh as a copy of the migrated template, which the first process to
    need it builds. Migrating takes about 15 s a process; a copy, well under one."""
    from django.db import connection

    name = connection.creation._get_test_db_name()
    template = TEMPLATE_PREFIX + schema_fingerprint()
    quote = connection.ops.quote_name
    with connection._nodb_cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [TEMPLATE_LOCK])
        try:
            cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", [template])
            if cursor.fetchone() is None:
                _build_template(cursor, template)
        finally:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [TEMPLATE_LOCK])
        # What a crashed run of this process left goes first.
        cursor.execute(f"DROP DATABASE IF EXISTS {quote(name)} WITH (FORCE)")
        cursor.execute(f"CREATE DATABASE {quote(name)} TEMPLATE {quote(template)}")
    _use_database(name)
    return name


def test_database_drop(name: str) -> None:
    """FORCE ends the connections still open (a process the tests started and did not
    stop, a thread's kept connection) instead of failing on them."""
    from django.db import connection

    connection.close()
    with connection._nodb_cursor() as cursor:
        cursor.execute(f"DROP DATABASE IF EXISTS {connection.ops.quote_name(name)} WITH (FORCE)")


def _build_template(cursor, template: str) -> None:
    """Migrates a new database under another name and renames it when it is whole, so a
    run that crashed while migrating leaves nothing that looks like a template. Older
    templates (other migrations) are dropped."""
    from django.core.management import call_command
    from django.db import connection

    quote = connection.ops.quote_name
    cursor.execute(
        "SELECT datname FROM pg_database WHERE starts_with(datname, %s)", [TEMPLATE_PREFIX]
    )
    for (stale,) in cursor.fetchall():
        cursor.execute(f"DROP DATABASE {quote(stale)} WITH (FORCE)")
    building = template + "_building"
    cursor.execute(f"CREATE DATABASE {quote(building)}")
    before = connection.settings_dict["NAME"]
    _use_database(building)
    try:
        call_command("migrate", verbosity=0, interactive=False, run_syncdb=True)
    finally:
        connection.close()
        _use_database(before)
    cursor.execute(f"ALTER DATABASE {quote(building)} RENAME TO {quote(template)}")
    # Nothing may be connected to a template while it is copied.
    cursor.execute(f"ALTER DATABASE {quote(template)} ALLOW_CONNECTIONS false")


def _use_database(name: str) -> None:
    from django.conf import settings
    from django.db import connection

    connection.close()
    settings.DATABASES[connection.alias]["NAME"] = name
    connection.settings_dict["NAME"] = name
