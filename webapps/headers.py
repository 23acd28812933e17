"""What the web app proxy removes, in one place (documented in the README).

The app is code an agent wrote: it must learn nothing of the viewer's credentials or
of who Quor (or an identity proxy in front of it) says the viewer is, it must believe
the URL, method, host, scheme, port and client address the proxy itself checked and
connected from, and it must not set cookies on its origin (the viewer cookie is Quor's).

Request headers are removed by class, each class by exact name and by name prefix: app
servers and frameworks trust far more headers than anyone can list, and a viewer (or a
careless front end) can send any of them. A name with a character other than a letter,
a digit or `-` is removed whatever it says (NAME_SHAPE)."""

import functools
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class HeaderClass:
    """Request headers removed together: lowercase exact names and name prefixes."""

    names: frozenset[str] = frozenset()
    prefixes: tuple[str, ...] = ()


# Hop-by-hop (RFC 9110 7.6.1) and framing headers: each side sets its own. Headers a
# request names in its Connection header go too (request_headers_to_forward).
HOP_BY_HOP = HeaderClass(
    frozenset(
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
)

# The viewer's credentials, Quor's hand-off cookie included (every cookie goes), and the
# CSRF tokens that pair with them.
CREDENTIALS = HeaderClass(
    frozenset(
        {
            "cookie",
            "authorization",
            "proxy-authorization",
            "x-csrftoken",
            "x-csrf-token",
            "x-xsrf-token",
        }
    )
)

# What proxies say about the chain that carried the request, and the outbound proxy a
# CGI program would use: `Proxy` becomes HTTP_PROXY (httpoxy). X-Forwarded-* covers
# every field a proxy claims to pass on: client, host, server, proto, ssl, scheme, port,
# prefix, path, uri, method, user, email, access token, client certificate; Proxy-*
# covers Proxy-Authorization, Proxy-Connection and Java's Proxy-Client-IP.
PROXY_CHAIN = HeaderClass(
    frozenset({"forwarded", "via", "max-forwards", "proxy", "x-forwarded", "forwarded-for"}),
    ("x-forwarded-", "proxy-"),
)

# The client's address, as frameworks and IP helpers read it (Rails' RemoteIp, request-ip,
# django-ipware, nginx realip, Java getClientIp recipes); the app sees the proxy's.
CLIENT_ADDRESS = HeaderClass(
    frozenset(
        {
            "x-real-ip",
            "x-client-ip",
            "client-ip",
            "true-client-ip",
            "x-cluster-client-ip",
            "x-originating-ip",
            "x-proxyuser-ip",
        }
    )
)

# Another host than the one the proxy routed by: the proxy names the upstream itself.
HOST_OVERRIDE = HeaderClass(frozenset({"host", "x-host", "x-http-host-override"}))

# Another scheme than the one the app is served with: apps then build https links or
# skip their redirect to https.
SCHEME_OVERRIDE = HeaderClass(frozenset({"x-url-scheme", "x-scheme", "front-end-https"}))

# Another URL or path than the request line's, which the proxy checked: IIS rewrite
# headers (read by old Symfony and Zend as the request URI), a script prefix, Traefik's
# and Home Assistant's paths. X-Original-* also covers nginx auth_request's URI and
# method and ingress-nginx's X-Original-Forwarded-For.
URL_OVERRIDE = HeaderClass(
    frozenset({"x-rewrite-url", "x-script-name", "x-replaced-path", "x-ingress-path"}),
    ("x-original-",),
)

# Another method than the request line's (Express method-override, Symfony and Laravel,
# Rack::MethodOverride, ASP.NET, OData). A form's `_method` field is the body's business.
METHOD_OVERRIDE = HeaderClass(
    frozenset({"x-http-method-override", "x-http-method", "x-method-override"})
)

# Headers a framework trusts because its own front part sets them: Next.js routes by
# X-Matched-Path and X-Invoke-*, and skips its middleware for X-Middleware-Subrequest
# (CVE-2025-29927); Rack::Sendfile hands the response file to an nginx internal path
# named by X-Sendfile-Type and X-Accel-Mapping.
FRAMEWORK_INTERNAL = HeaderClass(
    frozenset(
        {
            "x-matched-path",
            "x-now-route-matches",
            "x-middleware-subrequest",
            "x-sendfile-type",
            "x-accel-mapping",
        }
    ),
    ("x-invoke-",),
)

# CDNs, load balancers and front servers, by family: each family mixes the client's
# address, the scheme, its country, certificates and identity, and an app's own pages
# never send them. Cloudflare, Fastly, Akamai, CloudFront and AWS load balancers (not
# X-Amz-*, the S3 API's own), Azure Front Door and App Service, App Engine, Envoy,
# Vercel, Netlify, WebLogic's plug-in and IIS's ASP.NET Core Module.
FRONT_SERVER_FAMILIES = HeaderClass(
    prefixes=(
        "cf-",
        "fastly-",
        "akamai-",
        "x-akamai-",
        "cloudfront-",
        "x-amzn-",
        "x-azure-",
        "x-fd-",
        "x-arr-",
        "x-appengine-",
        "x-envoy-",
        "x-vercel-",
        "x-nf-",
        "wl-proxy-",
        "ms-aspnetcore-",
    )
)

# Who Quor or an identity proxy says the viewer is, and the tokens they vouch with:
# Authelia (Remote-*), oauth2-proxy, Google IAP, Pomerium, Azure EasyAuth, authentik,
# Grafana's auth proxy, Vouch, Kong, Shibboleth, Quor's own. Cloudflare Access and AWS
# ALB's OIDC headers are in their families above.
IDENTITY = HeaderClass(
    frozenset({"x-user", "x-email", "gap-auth", "x-anonymous-consumer"}),
    (
        "remote-",
        "x-remote-",
        "x-auth-request-",
        "x-goog-",
        "x-pomerium-",
        "x-ms-client-principal",
        "x-ms-token-",
        "x-authentik-",
        "x-webauth-",
        "x-vouch-",
        "x-consumer-",
        "x-authenticated-",
        "x-credential-",
        "shib-",
        "x-quor-",
    ),
)

# The viewer's TLS client certificate as a front server passes it on (RFC 9440's
# Client-Cert, nginx and HAProxy recipes, Google Cloud's load balancer).
CLIENT_CERTIFICATE = HeaderClass(
    frozenset({"x-client-verify", "x-client-dn"}),
    ("client-cert", "x-client-cert", "x-ssl-", "ssl-"),
)

STRIPPED_CLASSES = (
    HOP_BY_HOP,
    CREDENTIALS,
    PROXY_CHAIN,
    CLIENT_ADDRESS,
    HOST_OVERRIDE,
    SCHEME_OVERRIDE,
    URL_OVERRIDE,
    METHOD_OVERRIDE,
    FRAMEWORK_INTERNAL,
    FRONT_SERVER_FAMILIES,
    IDENTITY,
    CLIENT_CERTIFICATE,
)
REQUEST_HEADERS = frozenset().union(*(rule.names for rule in STRIPPED_CLASSES))
REQUEST_PREFIXES = tuple(prefix for rule in STRIPPED_CLASSES for prefix in rule.prefixes)

# The only names forwarded: letters, digits and `-` (every standard name fits; nginx
# ignores any other by default, Apache 2.4 keeps them out of CGI environs). CGI, WSGI
# and PHP environs turn `-` into `_`, so `X_Forwarded_Host` reaches an app as
# HTTP_X_FORWARDED_HOST, past every rule above, in servers that keep underscores
# (wsgiref, gunicorn before 22, PHP's built-in server), and gunicorn takes `SCRIPT_NAME`
# and `PATH_INFO` headers from any address its forwarded_allow_ips lets in. An app's own
# names with `_` go too.
NAME_SHAPE = re.compile(r"[a-z0-9-]+")

# Kept on purpose: content negotiation, conditional and range requests, caching,
# User-Agent, Origin, Referer and Sec-Fetch-* (the app's own CSRF and CORS checks need
# them; browsers set them), Sec-WebSocket-*, tracing (traceparent, X-Request-ID,
# X-Cloud-Trace-Context) and an app's own X- headers (X-Requested-With, X-Auth-Token,
# Next.js' RSC and Next-Action): none moves the URL, method, host, scheme or client.

# Response headers never passed to the viewer: the app's cookies, and what a front
# server would act on instead of passing it on (nginx's X-Accel-Redirect serves an
# internal location or file of the front server's, X-Sendfile and its kin a file of its
# disk): the app must not reach past the proxy through its responses.
RESPONSE_HEADERS = HOP_BY_HOP.names | frozenset(
    {
        "set-cookie", "set-cookie2", "x-sendfile", "x-sendfile2", "x-lighttpd-send-file",
        "x-litespeed-location",
    }
)  # fmt: skip
RESPONSE_HEADER_PREFIXES = ("x-accel-",)  # all of nginx's

# Added to every response: even opened directly, the app's documents get an opaque
# origin (no cookies, no storage of the app's host, no same-origin access).
SANDBOX_CSP = "sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads"


# The proxy frames each message itself (from what it parsed): these are never forwarded
# as the viewer sent them, and a Connection header naming them changes nothing.
FRAMING = frozenset({"content-length", "transfer-encoding", "host"})


# Every request asks about the same few dozen names, and matching one against all the
# prefixes costs more than the rest of the header rules: decisions are remembered, for
# names short enough that the thousand remembered stay small.
REMEMBERED_NAMES = 1024
REMEMBERED_NAME_LENGTH = 64


def _matches_a_rule(name: str) -> bool:
    return (
        name in REQUEST_HEADERS
        or name.startswith(REQUEST_PREFIXES)
        or NAME_SHAPE.fullmatch(name) is None
    )


_remembered = functools.lru_cache(maxsize=REMEMBERED_NAMES)(_matches_a_rule)


def is_stripped(name: str) -> bool:
    """`name` in lowercase: whether a request header of that name never reaches the app."""
    if len(name) > REMEMBERED_NAME_LENGTH:
        return _matches_a_rule(name)
    return _remembered(name)


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
        if not is_stripped(name) and name not in named_by_connection
    ]


def response_headers_to_return(headers) -> list[tuple[str, str]]:
    returned = []
    for name, value in headers:
        name = name.lower()
        if name not in RESPONSE_HEADERS and not name.startswith(RESPONSE_HEADER_PREFIXES):
            returned.append((name, value))
    return [*returned, ("content-security-policy", SANDBOX_CSP)]
