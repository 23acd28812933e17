"""Password login throttling: failed attempts are counted per account (its email, known
or not, so that a lockout tells nothing about which accounts exist) and per client
address, over a sliding window, in Redis (every web process sees the same counts).
`QUOR_LOGIN_MAX_FAILURES_PER_ACCOUNT` failures lock the account, and
`..._PER_ADDRESS` failures the address, for `QUOR_LOGIN_LOCKOUT_SECONDS`: every attempt
is then refused before the password is looked at, so a refusal says nothing about it.
A successful login clears the account's failures. A right password of a member whose
organization signs in with single sign-on only is refused too (quor/sso.py).

The check sits in an authentication backend, so it holds for every password form (the
login page and the admin's). If Redis cannot be reached, logins are neither counted
nor refused (logged): an outage of Redis must not lock everyone out.

Apart from failures, every request to an anonymous sign-in endpoint (the password
forms' POSTs, single sign-on's start and callback) is rate limited per client address
and, where the request names one, per account (`sign_in_rate_limited`): the lockout
slows guessing, the rate limit bounds the work an anonymous visitor makes Quor do
(password hashing, calls to identity providers).
"""

import functools
import hashlib
import logging
import math
import secrets

import redis
from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import PermissionDenied
from django.shortcuts import render

from quor.audit import audit_record, organization_of
from quor.lib.throttling import redis_client, request_slot
from quor.models import User
from quor.sso import password_login_refused

logger = logging.getLogger(__name__)

KEY_PREFIX = "quor:login:"

# KEYS: (failures, lock) pairs, a sorted set of failure times (ms) and a flag. ARGV[1]:
# the window (ms); ARGV[2]: the lockout (ms); ARGV[3]: this failure's member; ARGV[4...]:
# each pair's limit. Returns, per pair, 1 if this failure locked it, else 0. A lock
# starts the count again: after it, another full series of failures locks again.
_RECORD_FAILURE = """
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local window = tonumber(ARGV[1])
local locked = {}
for pair = 1, #KEYS / 2 do
  local failures, lock = KEYS[2 * pair - 1], KEYS[2 * pair]
  redis.call('ZREMRANGEBYSCORE', failures, '-inf', now - window)
  redis.call('ZADD', failures, now, ARGV[3])
  redis.call('PEXPIRE', failures, window)
  locked[pair] = 0
  if redis.call('ZCARD', failures) >= tonumber(ARGV[3 + pair]) then
    redis.call('DEL', failures)
    redis.call('SET', lock, '1', 'PX', ARGV[2])
    locked[pair] = 1
  end
end
return locked
"""


@functools.cache
def _record_failure_script():
    return redis_client().register_script(_RECORD_FAILURE)


def client_address(request) -> str:
    """The address the request came from: the connection's, or, behind
    `QUOR_TRUSTED_PROXY_COUNT` proxies that each append the address they saw to
    X-Forwarded-For, the one the first of them saw (entries before it are the
    client's to forge)."""
    if request is None:
        return ""
    proxies = settings.QUOR_TRUSTED_PROXY_COUNT
    forwarded = [a.strip() for a in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")]
    if proxies and len(forwarded) >= proxies and forwarded[-proxies]:
        return forwarded[-proxies]
    return request.META.get("REMOTE_ADDR", "")


def _account_key(email: str) -> str:
    """By the SHA-256 of the lower-cased email: no addresses in Redis, and `A@x` is `a@x`."""
    return "account:" + hashlib.sha256(email.strip().lower().encode()).hexdigest()


def _limited(email: str, address: str) -> list[tuple[str, int, str]]:
    """(key, limit, what) for each limit that applies; 0 turns one off."""
    per_account = settings.QUOR_LOGIN_MAX_FAILURES_PER_ACCOUNT
    per_address = settings.QUOR_LOGIN_MAX_FAILURES_PER_ADDRESS
    limits = []
    if email and per_account:
        limits.append((_account_key(email), per_account, "account"))
    if address and per_address:
        limits.append((f"address:{address}", per_address, "address"))
    return limits


def login_locked_for(email: str, address: str) -> int:
    """Seconds until the account or the address may try again; 0 if neither is locked."""
    keys = [f"{KEY_PREFIX}locked:{key}" for key, _, _ in _limited(email, address)]
    if not keys:
        return 0
    pipeline = redis_client().pipeline(transaction=False)
    for key in keys:
        pipeline.pttl(key)
    try:
        remaining_ms = max(pipeline.execute())
    except redis.RedisError as exc:
        logger.warning("login lockouts not checked: Redis is unreachable (%s)", exc)
        return 0
    return math.ceil(remaining_ms / 1000) if remaining_ms > 0 else 0


def login_failed(email: str, address: str) -> None:
    """Counts a failed attempt; one that reaches a limit locks and is audited."""
    limits = _limited(email, address)
    if not limits:
        return
    keys = []
    for key, _, _ in limits:
        keys += [f"{KEY_PREFIX}failures:{key}", f"{KEY_PREFIX}locked:{key}"]
    args = [
        settings.QUOR_LOGIN_FAILURE_WINDOW_SECONDS * 1000,
        settings.QUOR_LOGIN_LOCKOUT_SECONDS * 1000,
        secrets.token_hex(8),
        *(limit for _, limit, _ in limits),
    ]
    try:
        locked = _record_failure_script()(keys=keys, args=args)
    except redis.RedisError as exc:
        logger.warning("a failed login was not counted: Redis is unreachable (%s)", exc)
        return
    for (_, limit, what), now_locked in zip(limits, locked, strict=True):
        if now_locked:
            _audit_lockout(what, email, address, limit)


def _audit_lockout(what: str, email: str, address: str, failures: int) -> None:
    user = User.objects.filter(email__iexact=email.strip()).first() if what == "account" else None
    logger.warning("login: %s locked after %d failed attempts", what, failures)
    audit_record(
        "login.locked_out",
        target=user,
        organization=organization_of(user),
        changes={
            "locked": what,
            "email": email,
            "address": address,
            "failures": failures,
            "seconds": settings.QUOR_LOGIN_LOCKOUT_SECONDS,
        },
    )


def login_succeeded(email: str) -> None:
    try:
        redis_client().delete(f"{KEY_PREFIX}failures:{_account_key(email)}")
    except redis.RedisError as exc:
        logger.warning("a login's failures were not cleared: Redis is unreachable (%s)", exc)


class LoginAttemptsBackend(ModelBackend):
    """Django's email and password check, behind the lockouts. Listed before
    ModelBackend, which stays for the browser sessions it signed in (a session names its
    backend); a failed or refused attempt stops here (PermissionDenied), so the password
    is never checked twice."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        email = username or kwargs.get(User.USERNAME_FIELD)
        if not email or password is None:
            return None  # not a password login
        address = client_address(request)
        if login_locked_for(email, address):
            raise PermissionDenied
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is None:
            login_failed(email, address)
            raise PermissionDenied
        login_succeeded(email)
        if password_login_refused(user):
            raise PermissionDenied  # the usual message: it must not confirm the password
        return user


SIGN_IN_KEY_PREFIX = KEY_PREFIX + "rate:"


def sign_in_wait(request, email: str) -> int | None:
    """Counts one sign-in request against its address's limit and, given an email, its
    account's. None if counted, else the seconds until one more would be."""
    limits = []
    address = client_address(request)
    if address and (per_address := settings.QUOR_SIGN_IN_RATE_LIMIT_PER_ADDRESS):
        limits.append((f"address:{address}", per_address))
    if email and (per_account := settings.QUOR_SIGN_IN_RATE_LIMIT_PER_ACCOUNT):
        limits.append((_account_key(email), per_account))
    refused = request_slot(
        limits, settings.QUOR_SIGN_IN_RATE_WINDOW_SECONDS, key_prefix=SIGN_IN_KEY_PREFIX
    )
    return None if refused is None else refused[1]


def sign_in_rate_limited(view=None, *, methods=("POST",)):
    """A sign-in endpoint's requests of `methods` beyond the limits get a 429 page with
    Retry-After, before the view does any work (a password form's GET only shows it)."""

    def decorate(view):
        @functools.wraps(view)
        def limited(request, *args, **kwargs):
            if request.method in methods:
                wait = sign_in_wait(request, request.POST.get("username", ""))
                if wait is not None:
                    response = render(
                        request,
                        "registration/sign_in_throttled.html",
                        {"seconds": wait},
                        status=429,
                    )
                    response["Retry-After"] = str(wait)
                    return response
            return view(request, *args, **kwargs)

        return limited

    return decorate if view is None else decorate(view)
