"""The database server must have a pgvector that can filter inside its index scans."""

import re

from django.core.checks import Error, Tags, register
from django.db import connection

MINIMUM_PGVECTOR = (0, 8, 0)  # hnsw.iterative_scan, which search.py sets for every search


def pgvector_problem(version: str | None) -> str | None:
    """Why a server with this pgvector version (None: none) cannot serve search."""
    if version is None:
        return "The database server has no pgvector (the `vector` extension)."
    parts = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    if parts is None or tuple(int(part or 0) for part in parts.groups()) < MINIMUM_PGVECTOR:
        return f"The database server's pgvector is {version}; Quor needs 0.8.0 or later."
    return None


@register(Tags.database)
def check_pgvector(app_configs, databases=None, **kwargs):
    """Run by `migrate` and `check --database`: an older pgvector would fail every
    search on an unknown setting, or silently lose readable passages behind hidden ones."""
    if not databases or "default" not in databases:
        return []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce("
            "  (SELECT extversion FROM pg_extension WHERE extname = 'vector'),"
            "  (SELECT default_version FROM pg_available_extensions WHERE name = 'vector'))"
        )
        (version,) = cursor.fetchone()
    problem = pgvector_problem(version)
    if problem is None:
        return []
    return [
        Error(
            problem,
            hint="tools/install-postgres gives development a PostgreSQL with pgvector; in "
            "production use pgvector 0.8 or later (docs/decisions.md).",
            id="knowledge.E001",
        )
    ]
