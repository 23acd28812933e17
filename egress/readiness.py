"""The proxy's readiness, shared through Redis so any process can ask."""

import json
import time

import redis
from django.conf import settings

READY_TTL_SECONDS = 10


def _key() -> str:
    return f"quor:egress:ready:{settings.QUOR_DEPLOYMENT}"


def _client():
    return redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2, socket_timeout=2)


def publish_ready(*, sandboxes: int, listen: str) -> None:
    payload = json.dumps({"sandboxes": sandboxes, "listen": listen, "at": time.time()})
    _client().set(_key(), payload, ex=READY_TTL_SECONDS)


def readiness() -> dict | None:
    """What the running proxy last reported, or None if it is not ready."""
    raw = _client().get(_key())
    return json.loads(raw) if raw else None
