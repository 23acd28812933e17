"""API rate limits: per client (a personal API token, a service account's token, a
browser session's user) and per organization (all its members' requests together).

Counted in Redis, so that every web process sees the same counts, over a sliding window
(each request's time is kept until it leaves the window: no burst of twice the limit at
a window's edge). A refused request counts against neither limit. The time comes from
Redis, so web processes whose clocks differ agree. If Redis cannot be reached, requests
are let through: the limits protect the service, and an outage of Redis must not take
the API with it.
"""

import functools
import hashlib
import logging
import math
import secrets

import redis
from django.conf import settings
from redis.backoff import NoBackoff
from redis.retry import Retry
from rest_framework import exceptions
from rest_framework.throttling import BaseThrottle

from quor.lib.authentication import ApiTokenAuthentication
from quor.lib.permissions import OPERATOR, SANDBOX_CREDENTIAL, declared_permission
from quor.models import ServiceAccountToken

logger = logging.getLogger(__name__)

KEY_PREFIX = "quor:api-rate:"

# KEYS: one sorted set of request times (ms) per limit. ARGV[1]: the window (ms);
# ARGV[2]: this request's member; ARGV[3...]: each key's limit. Returns 0 if the request
# is counted, else {the refusing key's index, ms until it would be allowed}.
_TAKE = """
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local window = tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
  if redis.call('ZCARD', key) >= tonumber(ARGV[i + 2]) then
    local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    return {i, tonumber(oldest[2]) + window - now}
  end
end
for _, key in ipairs(KEYS) do
  redis.call('ZADD', key, now, ARGV[2])
  redis.call('PEXPIRE', key, window)
end
return 0
"""


@functools.cache
def redis_client() -> redis.Redis:
    """One connection pool per process. A dead pooled connection (Redis restarted) is
    retried once at once; redis-py's default would back off for seconds per request."""
    return redis.Redis.from_url(
        settings.REDIS_URL,
        socket_connect_timeout=2,
        socket_timeout=2,
        retry=Retry(NoBackoff(), 1),
    )


@functools.cache
def _take_script():
    return redis_client().register_script(_TAKE)


def request_slot(
    limits: list[tuple[str, int]], window_seconds: int, *, key_prefix: str = KEY_PREFIX
) -> tuple[int, float] | None:
    """Counts one request against each (key, limit) if none is exhausted. None if
    counted (or Redis is unreachable), else (the exhausted limit's index, seconds until
    one more request would be counted)."""
    if not limits:
        return None
    keys = [key_prefix + key for key, _ in limits]
    args = [window_seconds * 1000, secrets.token_hex(8), *(limit for _, limit in limits)]
    try:
        refused = _take_script()(keys=keys, args=args)
    except redis.RedisError as exc:
        logger.warning("rate limits not applied: Redis is unreachable (%s)", exc)
        return None
    if not refused:
        return None
    index, wait_ms = refused
    return index - 1, max(1, math.ceil(int(wait_ms) / 1000))


def _client(request) -> tuple[str, str]:
    """(key, description) of what made the request: a service account's token, a
    personal API token (by its SHA-256, as stored), or a browser session (its user)."""
    if isinstance(request.auth, ServiceAccountToken):
        return f"service-account-token:{request.auth.pk}", "this token"
    if isinstance(request.successful_authenticator, ApiTokenAuthentication):
        raw_token = request.headers["Authorization"].partition(" ")[2].strip()
        return f"api-token:{hashlib.sha256(raw_token.encode()).hexdigest()}", "this token"
    return f"user:{request.user.pk}", "your account"


class ApiRateThrottle(BaseThrottle):
    """Every API request of a signed-in user or token, except the sandbox runtime's
    reports (the agent's own calls, bounded by its turns) and the operator API (the
    deployment's automation). Raises Throttled itself, to say which limit was reached."""

    def allow_request(self, request, view):
        action = getattr(view, "action", None) or request.method.lower()
        if declared_permission(view, action) in (SANDBOX_CREDENTIAL, OPERATOR):
            return True
        if not (request.user and request.user.is_authenticated):
            return True  # refused by the permission check; nothing to count it against
        limits, described = [], []
        if per_token := settings.QUOR_API_RATE_LIMIT_PER_TOKEN:
            key, description = _client(request)
            limits.append((key, per_token))
            described.append(description)
        membership = getattr(request.user, "membership", None)
        if membership is not None and (per_org := settings.QUOR_API_RATE_LIMIT_PER_ORGANIZATION):
            limits.append((f"organization:{membership.organization_id}", per_org))
            described.append("your organization")
        window = settings.QUOR_API_RATE_WINDOW_SECONDS
        refused = request_slot(limits, window)
        if refused is None:
            return True
        index, wait = refused
        raise exceptions.Throttled(
            wait=wait,
            detail=f"Too many API requests for {described[index]}: at most "
            f"{limits[index][1]} in {window} s.",
        )
