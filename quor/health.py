"""Readiness of the services Quor depends on."""

import redis
from django.conf import settings
from django.db import connection

from quor.filestore import file_store_check
from sandboxes.backends import get_backend


def check_postgresql() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


def check_redis() -> None:
    client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2, socket_timeout=2)
    try:
        client.ping()
    finally:
        client.close()


def check_sandbox_backend() -> None:
    get_backend().ping()


READINESS_CHECKS = {
    "postgresql": check_postgresql,
    "redis": check_redis,
    "sandbox_backend": check_sandbox_backend,
    "file_store": file_store_check,
}


def readiness() -> dict[str, str]:
    """Each part's state: "ok", or the error that makes it not ready."""
    results = {}
    for name, check in READINESS_CHECKS.items():
        try:
            check()
        except Exception as exc:  # any failure means "not ready", named in the answer
            results[name] = f"error: {type(exc).__name__}: {exc}".strip()
        else:
            results[name] = "ok"
    return results
