"""What the web app proxy removes, in one place (documented in the README).

The app is code an agent wrote: it must learn nothing of the viewer's credentials or
of who Quor (or an identity proxy in front of it) says the viewer is, and it must not
set cookies on its origin (the viewer cookie is Quor's)."""

# Hop-by-hop (RFC 9110 7.6.1) and framing headers: each side sets its own.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)

# Request headers never forwarded to the app.
REQUEST_HEADERS = HOP_BY_HOP | frozenset(
    {
        # credentials, including Quor's own hand-off cookie (all cookies go)
        "cookie",
        "authorization",
        "proxy-authorization",
        # CSRF tokens
        "x-csrftoken",
        "x-csrf-token",
        "x-xsrf-token",
        # forwarding
        "forwarded",
        "x-real-ip",
        "via",
        "true-client-ip",
        "cf-connecting-ip",
        "x-client-ip",
        # identity set by Quor or an identity proxy (and the tokens they vouch with)
        "cf-access-jwt-assertion",
        "cf-access-authenticated-user-email",
        "x-goog-iap-jwt-assertion",
        "x-pomerium-jwt-assertion",
        "remote-user",
        "x-remote-user",
        "x-user",
        "x-email",
        "x-quor-user",
        "x-quor-session",
        # the proxy names the upstream itself
        "host",
    }
)
# Any request header starting with one of these is removed too.
REQUEST_PREFIXES = (
    "x-forwarded-",
    "x-remote-",
    "x-auth-request-",
    "x-goog-authenticated-",
    "x-amzn-oidc-",
    "x-ms-client-principal",
    "x-ms-token-",
    "x-pomerium-",
    "oidc_",
    "x-quor-",
)

# Response headers never passed to the viewer.
RESPONSE_HEADERS = HOP_BY_HOP | frozenset({"set-cookie", "set-cookie2"})

# Added to every response: even opened directly, the app's documents get an opaque
# origin (no cookies, no storage of the app's host, no same-origin access).
SANDBOX_CSP = "sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads"


# The proxy frames each message itself (from what it parsed): these are never forwarded
# as the viewer sent them, and a Connection header naming them changes nothing.
FRAMING = frozenset({"content-length", "transfer-encoding", "host"})


def request_headers_to_forward(headers) -> list[tuple[str, str]]:
    """`headers`: (name, value) pairs, any case. Connection-named headers go too, except
    the framing ones, which the proxy writes itself: a viewer naming Content-Length in
    Connection must not make the app read the body as another request."""
    pairs = [(name.lower(), value) for name, value in headers]
    named_by_connection = {
        token.strip().lower()
        for name, value in pairs
        if name == "connection"
        for token in value.split(",")
    } - FRAMING
    return [
        (name, value)
        for name, value in pairs
        if name not in REQUEST_HEADERS
        and name not in named_by_connection
        and not name.startswith(REQUEST_PREFIXES)
    ]


def response_headers_to_return(headers) -> list[tuple[str, str]]:
    return [
        (name.lower(), value) for name, value in headers if name.lower() not in RESPONSE_HEADERS
    ] + [("content-security-policy", SANDBOX_CSP)]
