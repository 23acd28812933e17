"""The web app proxy's own pages, on the app's origin: its refusals and redirects, the
"waking up" page, and a public link's sign-in forms."""

import functools
from urllib.parse import urlencode

from django.conf import settings
from django.template.loader import render_to_string
from django.templatetags.static import static

from webapps import gate, link_codes, services
from webapps import headers as header_rules

# The title of a page, by status.
PAGE_TITLES = {
    302: "Opening the app",
    400: "Bad request",
    403: "Not allowed",
    404: "App not found",
    429: "Too many requests",
    502: "The app did not answer",
    503: "The app is not running",
}

# A sign-in page's steps: its title and where its form posts.
SIGN_IN_STEPS = {
    "password": ("Password needed", gate.LINK_PASSWORD_PATH),
    "email": ("Email address needed", gate.LINK_EMAIL_PATH),
    "code": ("Code needed", gate.LINK_CODE_PATH),
}


@functools.cache
def _stylesheet() -> str:
    """Quor's stylesheet on Quor's origin: the page is on the app's."""
    return settings.QUOR_PUBLIC_URL.rstrip("/") + static("quor/quor.css")


def page(status: int, message: str, location=None, refresh=None) -> tuple[list, bytes]:
    title = "The app is waking up" if refresh else PAGE_TITLES.get(status, "Quor web app")
    body = render_to_string(
        "webapps/proxy_page.html",
        {"title": title, "message": message, "refresh": refresh, "stylesheet": _stylesheet()},
    ).encode()
    headers = [
        ("content-type", "text/html; charset=utf-8"),
        ("content-length", str(len(body))),
        ("cache-control", "no-store"),
        ("content-security-policy", header_rules.SANDBOX_CSP),
    ]
    if location:
        headers.append(("location", location))
    if refresh:  # the page reloads itself (browsers follow Refresh), clients may retry
        headers += [("refresh", str(refresh)), ("retry-after", str(refresh))]
    return headers, body


def sign_in_page(step: str, next_path: str, *, error="", email="") -> tuple[list, bytes]:
    """A public link's sign-in form: its password, or an email address and then the
    code mailed to it. Not under the sandbox CSP (an opaque origin would make the cookie
    its answer sets a third-party one): a CSP with no script at all."""
    title, action = SIGN_IN_STEPS[step]
    next_path = services.safe_next(next_path)
    body = render_to_string(
        "webapps/link_sign_in.html",
        {
            "step": step,
            "title": title,
            "stylesheet": _stylesheet(),
            "action": action,
            "next": next_path,
            "next_query": urlencode({"next": next_path}),
            "email_action": gate.LINK_EMAIL_PATH,
            "email": email,
            "code_minutes": link_codes.CODE_SECONDS // 60,
            "error": error,
        },
    ).encode()
    quor_origin = settings.QUOR_PUBLIC_URL.rstrip("/")
    csp = f"default-src 'none'; style-src {quor_origin}; form-action 'self'; frame-ancestors 'none'"
    return [
        ("content-type", "text/html; charset=utf-8"),
        ("content-length", str(len(body))),
        ("cache-control", "no-store"),
        ("content-security-policy", csp),
    ], body
