"""Public links' quotas, counted in Redis so that every web app proxy process shares
them: requests per fixed minute, bytes served over the link's life (taken before they
are written, so parallel requests and processes cannot serve more), and sign-in
attempts (passwords, email codes asked for and given) per visitor address. The proxy
asks here on each visitor request (asyncio: the proxy's event loop never waits on a
socket).

Unlike the API's rate limits, a Redis that cannot be reached refuses visitors (the
proxy answers 503): a quota that holds only while Redis is up is not a quota."""

import functools
import time

import redis.asyncio
from django.conf import settings

from webapps.gate import BANDWIDTH_USED_UP, REQUESTS_USED_UP

KEY_PREFIX = "quor:public-link:"
# Sign-in attempts per visitor address and link in SIGN_IN_WINDOW_SECONDS.
SIGN_IN_ATTEMPTS = 10
SIGN_IN_WINDOW_SECONDS = 15 * 60

# KEYS[1]: this minute's request count; KEYS[2]: bytes served. ARGV: requests per
# minute, bandwidth in bytes. Returns 0 if the request is counted, 1 if the minute's
# requests are used up, 2 if the bandwidth is.
_TAKE_REQUEST = """
if tonumber(redis.call('GET', KEYS[2]) or '0') >= tonumber(ARGV[2]) then
  return 2
end
local count = redis.call('INCR', KEYS[1])
if count == 1 then
  redis.call('EXPIRE', KEYS[1], 120)
end
if count > tonumber(ARGV[1]) then
  return 1
end
return 0
"""


# KEYS[1]: bytes served. ARGV: bytes wanted, bandwidth, 1 if all or nothing, when the
# count expires (a Unix time). Returns the bytes taken: all wanted, what is left of the
# bandwidth if less (0 when all or nothing).
_TAKE_BYTES = """
local room = tonumber(ARGV[2]) - tonumber(redis.call('GET', KEYS[1]) or '0')
local want = tonumber(ARGV[1])
if want > room then
  if ARGV[3] == '1' or room <= 0 then
    return 0
  end
  want = room
end
redis.call('INCRBY', KEYS[1], want)
redis.call('EXPIREAT', KEYS[1], ARGV[4])
return want
"""


@functools.cache
def redis_client() -> redis.asyncio.Redis:
    """One pool per proxy process (one event loop: `manage.py run_webapp_proxy`)."""
    return redis.asyncio.Redis.from_url(
        settings.REDIS_URL, socket_connect_timeout=2, socket_timeout=2
    )


@functools.cache
def _take_request_script():
    return redis_client().register_script(_TAKE_REQUEST)


@functools.cache
def _take_bytes_script():
    return redis_client().register_script(_TAKE_BYTES)


# What the request script answers (its refusals are numbers in Lua).
_REFUSALS = {0: "", 1: REQUESTS_USED_UP, 2: BANDWIDTH_USED_UP}


def _bytes_key(link) -> str:
    return f"{KEY_PREFIX}{link.pk}:bytes"


async def request_take(link) -> tuple[str, int]:
    """("", 0) if the request may go to the app and is counted, else (REQUESTS_USED_UP,
    seconds until the next minute) or (BANDWIDTH_USED_UP, 0): that never comes back."""
    now = time.time()
    minute = int(now // 60)
    keys = [f"{KEY_PREFIX}{link.pk}:requests:{minute}", _bytes_key(link)]
    refused = await _take_request_script()(
        keys=keys, args=[link.requests_per_minute, link.bandwidth_bytes]
    )
    refused = _REFUSALS[int(refused)]
    if refused == REQUESTS_USED_UP:
        return REQUESTS_USED_UP, max(1, 60 - int(now % 60))
    return refused, 0


async def bytes_take(link, size: int, *, whole: bool) -> int:
    """Takes up to `size` bytes of the link's bandwidth for a visitor's connection to
    write, before it writes them; returns how many it may write (all or none if
    `whole`). The count lives as long as the link."""
    expires = int(link.expires_at.timestamp()) + 60
    args = [size, link.bandwidth_bytes, int(whole), expires]
    return int(await _take_bytes_script()(keys=[_bytes_key(link)], args=args))


async def bytes_give_back(link, size: int) -> None:
    """What a connection took and did not write (its response was shorter, or ended)."""
    await redis_client().decrby(_bytes_key(link), size)


async def sign_in_attempt_take(link_id, address: str) -> bool:
    """Counts a sign-in form sent from this address; False once they are used up."""
    key = f"{KEY_PREFIX}{link_id}:sign-in:{address}"
    async with redis_client().pipeline(transaction=True) as pipe:
        pipe.incr(key)
        pipe.expire(key, SIGN_IN_WINDOW_SECONDS, nx=True)
        count, _ = await pipe.execute()
    return count <= SIGN_IN_ATTEMPTS
