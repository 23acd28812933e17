"""One-time codes of public links restricted to email domains, kept in Redis so that
every web app proxy process knows them: a code is asked for at one proxy and may be
given at another. Only an HMAC of the code is stored, for CODE_SECONDS; it opens the
link once, and CODE_ATTEMPTS wrong entries void it. Codes sent to one address are
limited whatever the link, so that links cannot be used to flood a mailbox.

asyncio (redis.asyncio), like the quotas: the proxy's event loop never waits on a socket.
Without Redis the proxy answers 503, as it does for the quotas."""

import functools
import hashlib
import secrets

from django.utils.crypto import salted_hmac

from webapps import link_quotas

CODE_DIGITS = 8
CODE_SECONDS = 10 * 60
# Wrong entries of one code before it is void (a new code must be asked for).
CODE_ATTEMPTS = 5
# Codes asked for one email address, whatever the link, in CODES_PER_EMAIL_WINDOW_SECONDS.
CODES_PER_EMAIL = 5
CODES_PER_EMAIL_WINDOW_SECONDS = 60 * 60
_HMAC_SALT = "quor.webapps.link-code"

# KEYS[1]: the code's hash (digest, wrong). ARGV: the digest given, CODE_ATTEMPTS.
# Returns 1 and deletes the code if the digest is right; else counts a wrong entry and
# deletes the code at the last one. 0 when there is no code (none, used, expired).
_TAKE_CODE = """
local digest = redis.call('HGET', KEYS[1], 'digest')
if not digest then
  return 0
end
if digest == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
if redis.call('HINCRBY', KEYS[1], 'wrong', 1) >= tonumber(ARGV[2]) then
  redis.call('DEL', KEYS[1])
end
return 0
"""


def code_new() -> str:
    return f"{secrets.randbelow(10**CODE_DIGITS):0{CODE_DIGITS}d}"


def code_digest(link_id, email: str, code: str) -> str:
    """What Redis keeps of a code: an HMAC with Quor's secret key, bound to the link and
    the address (a code of one link or address opens no other)."""
    return salted_hmac(
        _HMAC_SALT, f"{link_id}\n{email}\n{code.strip()}", algorithm="sha256"
    ).hexdigest()


def _email_key(email: str) -> str:
    return hashlib.sha256(email.encode()).hexdigest()  # no address in Redis's key names


def code_key(link_id, email: str) -> str:
    return f"{link_quotas.KEY_PREFIX}{link_id}:code:{_email_key(email)}"


async def code_send_take(email: str) -> bool:
    """Counts a code asked for this address (any link); False once they are used up.
    Counted for every address, allowed or not, so that the answer says nothing."""
    key = f"{link_quotas.KEY_PREFIX}email:{_email_key(email)}:codes"
    async with link_quotas.redis_client().pipeline(transaction=True) as pipe:
        pipe.incr(key)
        pipe.expire(key, CODES_PER_EMAIL_WINDOW_SECONDS, nx=True)
        count, _ = await pipe.execute()
    return count <= CODES_PER_EMAIL


async def code_store(link_id, email: str, digest: str) -> None:
    """Keeps the code of this link and address (replacing an earlier one)."""
    key = code_key(link_id, email)
    async with link_quotas.redis_client().pipeline(transaction=True) as pipe:
        pipe.delete(key)
        pipe.hset(key, mapping={"digest": digest, "wrong": 0})
        pipe.expire(key, CODE_SECONDS)
        await pipe.execute()


@functools.cache
def _take_code_script():
    return link_quotas.redis_client().register_script(_TAKE_CODE)


async def code_take(link_id, email: str, code: str) -> bool:
    """True, once, for the right code of this link and address within CODE_SECONDS."""
    digest = code_digest(link_id, email, code)
    taken = await _take_code_script()(keys=[code_key(link_id, email)], args=[digest, CODE_ATTEMPTS])
    return taken == 1
