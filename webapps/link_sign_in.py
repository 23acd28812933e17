"""A public link's sign-in, as the web app proxy serves it on the link's origin: the
password form, or an email address and then the code mailed to it. Every answered form
counts as an attempt per visitor address (IPv4, or IPv6 /64) and link, across proxy
processes (webapps/link_quotas.py); the answer for an address never tells whether its
domain may open the link.

Asynchronous, for the proxy's event loop: the database through database_sync_to_async,
Redis through its asyncio client."""

from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qs

from channels.db import database_sync_to_async

from webapps import gate, link_codes, link_quotas, services

WRONG_ANSWERS = {
    "password": "That password is not right.",
    "code": "That code is not right, was used already or has expired.",
}


@dataclass(frozen=True)
class Form:
    """A sign-in form page (webapps/pages.py): `step` is password, email or code."""

    status: int
    step: str
    next_path: str
    error: str = ""
    email: str = ""


@dataclass(frozen=True)
class SignedIn:
    """303 to where the visitor was going, with the link's visitor cookie."""

    location: str
    cookie: str


@dataclass(frozen=True)
class Attempt:
    """What the visitor sent: a form of `gate.LINK_SIGN_IN_PATHS`, asked for or posted."""

    method: str
    path: str
    query: str
    form: bytes
    address: str  # the visitor's (gate.client_address)
    user_agent: str


@database_sync_to_async
def visit_record(link, address, user_agent, authenticated_by, email=""):
    services.public_link_visit_record(
        link=link,
        address=address,
        user_agent=user_agent,
        authenticated_by=authenticated_by,
        email=email,
    )


@database_sync_to_async
def _password_matches(link, password):
    return services.public_link_password_matches(link, password)


async def answer(link, attempt: Attempt, send_code: Callable[[object, str], None]):
    """A Form, a SignedIn or a gate.Reply. `send_code(link, email)` mails a new code
    without the visitor waiting on it."""
    if gate.LINK_SIGN_IN_PATHS[attempt.path] != link.visitor_auth:
        return gate.Reply(404, "Not found.")
    if attempt.method != "POST":
        return Form(200, link.visitor_auth, parse_qs(attempt.query).get("next", ["/"])[0])
    if not await link_quotas.sign_in_attempt_take(link.pk, gate.attempts_key(attempt.address)):
        message = "Too many attempts from your address. Try again later."
        return gate.Reply(429, message, retry_after=link_quotas.SIGN_IN_WINDOW_SECONDS)
    form = parse_qs(attempt.form.decode("utf-8", "replace"))
    fields = {name: values[0] for name, values in form.items()}
    next_path = services.safe_next(fields.get("next", "/"))
    if attempt.path == gate.LINK_EMAIL_PATH:
        return await _code_asked(link, fields.get("email", ""), next_path, send_code)
    if attempt.path == gate.LINK_PASSWORD_PATH:
        email, step = "", "password"
        admitted = await _password_matches(link, fields.get("password", ""))
    else:
        email, step = services.visitor_email(fields.get("email", "")) or "", "code"
        code = fields.get("code", "")
        admitted = bool(email) and await link_codes.code_take(link.pk, email, code)
    if not admitted:
        return Form(403, step, next_path, error=WRONG_ANSWERS[step], email=email)
    await visit_record(link, attempt.address, attempt.user_agent, link.visitor_auth, email)
    return SignedIn(next_path, services.link_visitor_cookie(link, email))


async def _code_asked(link, typed: str, next_path: str, send_code):
    """An email link's visitor gave an address: a code goes to it if its domain is one
    of the link's. The answer is the same either way, given before the mail is sent (no
    time to tell them apart), so the page does not tell the link's domains."""
    email = services.visitor_email(typed)
    if email is None:
        return Form(400, "email", next_path, error="That is not an email address.")
    if not await link_codes.code_send_take(email):
        message = "Too many codes were asked for this address. Try again later."
        return gate.Reply(429, message, retry_after=link_codes.CODES_PER_EMAIL_WINDOW_SECONDS)
    if services.email_may_open(link, email):
        send_code(link, email)
    return Form(200, "code", next_path, email=email)
