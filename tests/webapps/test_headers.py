"""The request headers the web app proxy removes (`webapps.headers`), by class, with the
real names that servers, frameworks, CDNs and identity proxies honour, and the ordinary
ones an app needs; then the same through the running proxy on real sockets, to an
aiohttp app that records what it received and to a WSGI app on wsgiref behind
Werkzeug's ProxyFix trusting every X-Forwarded header, with the request lines and Host
headers the proxy refuses because they would name another host to the app."""

import json
import threading
import time
from wsgiref.simple_server import WSGIRequestHandler, make_server

import pytest
from werkzeug.middleware.proxy_fix import ProxyFix
from werkzeug.wrappers import Request, Response

from tests.environment import PORTS
from tests.webapps.test_proxy_protocol import APP, VIEWER_ID, Stack, read_until_closed
from webapps import headers as header_rules
from webapps import pages


def honoured(name: str, by: str):
    return pytest.param(name, id=f"{name} ({by})")


HOP_BY_HOP = [
    honoured(name, "RFC 9110 hop-by-hop")
    for name in ("Connection", "Keep-Alive", "Proxy-Connection", "TE", "Trailer", "Upgrade")
] + [honoured("Transfer-Encoding", "framing: the proxy writes its own")]

CREDENTIALS = [
    honoured("Cookie", "every cookie, Quor's hand-off cookie included"),
    honoured("Authorization", "the viewer's credentials"),
    honoured("Proxy-Authorization", "the viewer's proxy credentials"),
    honoured("X-CSRFToken", "Django"),
    honoured("X-CSRF-Token", "Rails"),
    honoured("X-XSRF-Token", "Angular, Laravel"),
]

URL_OVERRIDE = [
    honoured("X-Original-URL", "IIS URL Rewrite; old Symfony and Zend: the request URI"),
    honoured("X-Rewrite-URL", "ISAPI_Rewrite; old Symfony and Zend: the request URI"),
    honoured("X-Original-URI", "nginx auth_request, ingress-nginx"),
    honoured("X-Forwarded-Prefix", "Werkzeug ProxyFix, Spring, ASP.NET Core, Traefik"),
    honoured("X-Forwarded-Path", "Kong"),
    honoured("X-Forwarded-Uri", "Traefik forwardAuth, Authelia"),
    honoured("X-Script-Name", "Flask reverse-proxy recipe: SCRIPT_NAME"),
    honoured("X-Replaced-Path", "Traefik ReplacePath"),
    honoured("X-Envoy-Original-Path", "Envoy"),
    honoured("X-Ingress-Path", "Home Assistant ingress"),
]

METHOD_OVERRIDE = [
    honoured("X-HTTP-Method-Override", "Express method-override, Symfony, Rack, ASP.NET Core"),
    honoured("X-HTTP-Method", "OData, ASP.NET Web API"),
    honoured("X-Method-Override", "method-override's IBM name"),
    honoured("X-Original-Method", "nginx auth_request recipes"),
    honoured("X-Forwarded-Method", "Traefik forwardAuth"),
]

HOST_OVERRIDE = [
    honoured("Host", "the proxy names the upstream itself"),
    honoured("X-Forwarded-Host", "Django, Rails, Express, Symfony, Werkzeug ProxyFix"),
    honoured("X-Forwarded-Server", "Apache mod_proxy"),
    honoured("X-Host", "PHP and CGI apps"),
    honoured("X-HTTP-Host-Override", "host-header override lists"),
    honoured("X-Original-Host", "ASP.NET Core ForwardedHeaders"),
]

SCHEME_OVERRIDE = [
    honoured("X-Forwarded-Proto", "Django SECURE_PROXY_SSL_HEADER, gunicorn, Express"),
    honoured("X-Forwarded-Ssl", "Rack, gunicorn"),
    honoured("X-Forwarded-Scheme", "Rack"),
    honoured("X-Forwarded-Protocol", "gunicorn"),
    honoured("X-Forwarded-Port", "Werkzeug ProxyFix, Symfony, Laravel"),
    honoured("X-Url-Scheme", "Pyramid and Paste apps, PHP apps"),
    honoured("X-Scheme", "ingress-nginx, Flask recipes"),
    honoured("Front-End-Https", "Microsoft ISA; CodeIgniter, phpMyAdmin"),
]

CLIENT_ADDRESS = [
    honoured("X-Forwarded-For", "Express, Rails, Werkzeug ProxyFix, django-ipware"),
    honoured("X-Real-IP", "nginx realip, request-ip"),
    honoured("X-Client-IP", "request-ip, django-ipware"),
    honoured("Client-IP", "Rails RemoteIp"),
    honoured("True-Client-IP", "Akamai, Cloudflare"),
    honoured("X-Cluster-Client-IP", "Rackspace; request-ip, django-ipware"),
    honoured("Proxy-Client-IP", "Java getClientIp recipes"),
    honoured("X-Originating-IP", "Microsoft"),
    honoured("X-Remote-IP", "IP helpers"),
    honoured("X-Remote-Addr", "IP helpers"),
    honoured("X-Forwarded", "request-ip, django-ipware"),
    honoured("Forwarded-For", "request-ip, django-ipware"),
    honoured("X-ProxyUser-Ip", "Google"),
    honoured("X-Original-Forwarded-For", "ingress-nginx"),
]

PROXY_CHAIN = [
    honoured("Forwarded", "RFC 7239: Rack, Spring, Symfony, Werkzeug"),
    honoured("Via", "RFC 9110 proxies"),
    honoured("Max-Forwards", "RFC 9110 TRACE and OPTIONS"),
    honoured("Proxy", "httpoxy: HTTP_PROXY in CGI"),
]

FRAMEWORK_INTERNAL = [
    honoured("X-Middleware-Subrequest", "Next.js skips its middleware, CVE-2025-29927"),
    honoured("X-Matched-Path", "Next.js minimal mode"),
    honoured("X-Now-Route-Matches", "Next.js"),
    honoured("X-Invoke-Path", "Next.js router worker"),
    honoured("X-Invoke-Query", "Next.js router worker"),
    honoured("X-Sendfile-Type", "Rack::Sendfile"),
    honoured("X-Accel-Mapping", "Rack::Sendfile: an nginx internal path"),
]

FRONT_SERVER_FAMILIES = [
    honoured("CF-Connecting-IP", "Cloudflare"),
    honoured("CF-Connecting-IPv6", "Cloudflare"),
    honoured("CF-Visitor", "Cloudflare: the scheme, read by Laravel and WordPress plugins"),
    honoured("CF-IPCountry", "Cloudflare"),
    honoured("CF-Ray", "Cloudflare"),
    honoured("Fastly-Client-IP", "Fastly"),
    honoured("Fastly-SSL", "Fastly"),
    honoured("Akamai-Origin-Hop", "Akamai"),
    honoured("X-Akamai-Edgescape", "Akamai"),
    honoured("CloudFront-Viewer-Address", "CloudFront"),
    honoured("CloudFront-Forwarded-Proto", "CloudFront"),
    honoured("X-Amzn-Trace-Id", "AWS load balancers: the family goes whole"),
    honoured("X-Azure-ClientIP", "Azure Front Door"),
    honoured("X-Azure-SocketIP", "Azure Front Door"),
    honoured("X-Azure-FDID", "Azure Front Door: apps check it to accept only their door"),
    honoured("X-FD-HealthProbe", "Azure Front Door"),
    honoured("X-ARR-SSL", "Azure App Service"),
    honoured("X-AppEngine-User-IP", "App Engine"),
    honoured("X-AppEngine-Cron", "App Engine: apps trust it as their scheduler"),
    honoured("X-AppEngine-Https", "App Engine"),
    honoured("X-Envoy-External-Address", "Envoy"),
    honoured("X-Envoy-Internal", "Envoy"),
    honoured("X-Vercel-Forwarded-For", "Vercel"),
    honoured("X-Vercel-IP-Country", "Vercel, Next.js geo"),
    honoured("X-Nf-Client-Connection-Ip", "Netlify"),
    honoured("WL-Proxy-Client-IP", "WebLogic plug-in"),
    honoured("WL-Proxy-SSL", "WebLogic plug-in: the scheme"),
    honoured("MS-ASPNETCORE-TOKEN", "IIS ASP.NET Core Module"),
]

IDENTITY = [
    honoured("Remote-User", "Authelia, Caddy forward_auth"),
    honoured("Remote-Groups", "Authelia"),
    honoured("Remote-Email", "Authelia"),
    honoured("X-Remote-User", "Apache recipes"),
    honoured("X-User", "auth proxies"),
    honoured("X-Email", "auth proxies"),
    honoured("X-Auth-Request-User", "oauth2-proxy"),
    honoured("X-Auth-Request-Email", "oauth2-proxy"),
    honoured("X-Auth-Request-Access-Token", "oauth2-proxy"),
    honoured("X-Forwarded-User", "oauth2-proxy"),
    honoured("X-Forwarded-Email", "oauth2-proxy"),
    honoured("X-Forwarded-Access-Token", "oauth2-proxy"),
    honoured("GAP-Auth", "oauth2_proxy before 5"),
    honoured("Cf-Access-Jwt-Assertion", "Cloudflare Access"),
    honoured("Cf-Access-Authenticated-User-Email", "Cloudflare Access"),
    honoured("X-Goog-IAP-JWT-Assertion", "Google IAP"),
    honoured("X-Goog-Authenticated-User-Email", "Google IAP"),
    honoured("X-Goog-Authenticated-User-Id", "Google IAP"),
    honoured("X-Pomerium-Jwt-Assertion", "Pomerium"),
    honoured("X-Pomerium-Claim-Email", "Pomerium"),
    honoured("X-MS-Client-Principal", "Azure EasyAuth"),
    honoured("X-MS-Client-Principal-Name", "Azure EasyAuth"),
    honoured("X-MS-Token-AAD-Access-Token", "Azure EasyAuth"),
    honoured("X-Amzn-Oidc-Data", "AWS ALB"),
    honoured("X-Amzn-Oidc-Identity", "AWS ALB"),
    honoured("X-Amzn-Oidc-Accesstoken", "AWS ALB"),
    honoured("X-authentik-username", "authentik"),
    honoured("X-WEBAUTH-USER", "Grafana auth proxy"),
    honoured("X-Vouch-User", "Vouch Proxy"),
    honoured("X-Consumer-Username", "Kong"),
    honoured("X-Authenticated-Userid", "Kong"),
    honoured("X-Credential-Identifier", "Kong"),
    honoured("X-Anonymous-Consumer", "Kong"),
    honoured("Shib-Identity-Provider", "Shibboleth"),
    honoured("X-Quor-User", "Quor"),
    honoured("X-Quor-Session", "Quor"),
]

CLIENT_CERTIFICATE = [
    honoured("Client-Cert", "RFC 9440"),
    honoured("Client-Cert-Chain", "RFC 9440"),
    honoured("X-SSL-Client-Cert", "nginx and HAProxy recipes"),
    honoured("X-SSL-Client-Verify", "nginx and HAProxy recipes"),
    honoured("X-SSL-Client-S-DN", "HAProxy recipes"),
    honoured("X-Client-Cert", "nginx recipes"),
    honoured("X-Client-Cert-Present", "Google Cloud load balancer"),
    honoured("X-Client-Verify", "nginx recipes"),
    honoured("X-Client-DN", "nginx recipes"),
    honoured("SSL-Client-Cert", "Apache recipes"),
    honoured("X-ARR-ClientCert", "Azure App Service"),
    honoured("X-Forwarded-Client-Cert", "Envoy, Istio"),
    honoured("X-Forwarded-Tls-Client-Cert", "Traefik"),
    honoured("X-Amzn-Mtls-Clientcert", "AWS ALB"),
    honoured("MS-ASPNETCORE-CLIENTCERT", "IIS ASP.NET Core Module"),
    honoured("WL-Proxy-Client-Cert", "WebLogic plug-in"),
]

# `_` becomes indistinguishable from `-` in CGI, WSGI and PHP environs.
NAME_SHAPE = [
    honoured("X_Forwarded_Host", "wsgiref, gunicorn before 22, PHP: HTTP_X_FORWARDED_HOST"),
    honoured("X_Forwarded_Proto", "wsgiref, gunicorn before 22, PHP"),
    honoured("X_Forwarded_Prefix", "wsgiref + ProxyFix: SCRIPT_NAME"),
    honoured("X_Original_URL", "PHP: HTTP_X_ORIGINAL_URL"),
    honoured("X_HTTP_Method_Override", "Rack on a CGI-style server"),
    honoured("SCRIPT_NAME", "gunicorn forwarder_headers: the script prefix"),
    honoured("PATH_INFO", "gunicorn forwarder_headers: the path"),
    honoured("Remote_User", "HTTP_REMOTE_USER"),
    honoured("OIDC_CLAIM_email", "mod_auth_openidc"),
    honoured("X_App_Token", "any name with _, an app's own too"),
    honoured("X.Forwarded.Host", "neither letter, digit nor dash"),
]

STRIPPED = (
    HOP_BY_HOP
    + CREDENTIALS
    + URL_OVERRIDE
    + METHOD_OVERRIDE
    + HOST_OVERRIDE
    + SCHEME_OVERRIDE
    + CLIENT_ADDRESS
    + PROXY_CHAIN
    + FRAMEWORK_INTERNAL
    + FRONT_SERVER_FAMILIES
    + IDENTITY
    + CLIENT_CERTIFICATE
    + NAME_SHAPE
)

KEPT = [
    ("Accept", "text/html,application/xhtml+xml"),
    ("Accept-Encoding", "gzip, br"),
    ("Accept-Language", "en-US,en;q=0.9"),
    ("Content-Type", "application/json"),
    ("Range", "bytes=0-99"),
    ("If-Range", '"v1"'),
    ("If-None-Match", '"v1"'),
    ("If-Modified-Since", "Tue, 01 Dec 2026 00:00:00 GMT"),
    ("If-Match", '"v1"'),
    ("Cache-Control", "no-cache"),
    ("Pragma", "no-cache"),
    ("User-Agent", "Mozilla/5.0"),
    ("Origin", "null"),
    ("Referer", f"http://wapp.localhost:{PORTS.WEBAPP_PROXY}/"),
    ("Sec-Fetch-Dest", "empty"),
    ("Sec-Fetch-Mode", "cors"),
    ("Sec-Fetch-Site", "same-origin"),
    ("Sec-CH-UA-Mobile", "?0"),
    ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
    ("Sec-WebSocket-Version", "13"),
    ("Sec-WebSocket-Protocol", "chat"),
    ("Sec-WebSocket-Extensions", "permessage-deflate"),
    ("X-Requested-With", "XMLHttpRequest"),
    ("X-App-Token", "the-apps-own"),
    ("X-Auth-Token", "the-apps-own"),
    ("X-Api-Key", "the-apps-own"),
    ("X-Client-Version", "1.2.3"),
    ("Idempotency-Key", "k1"),
    ("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
    ("X-Request-ID", "r1"),
    ("X-Cloud-Trace-Context", "105445aa7843bc8bf206b12000100000/1;o=1"),
    ("X-Amz-Date", "20261201T000000Z"),
    ("X-Amz-Content-Sha256", "UNSIGNED-PAYLOAD"),
    ("Upgrade-Insecure-Requests", "1"),
    ("Priority", "u=1, i"),
    ("RSC", "1"),
    ("Next-Router-State-Tree", "%5B%22%22%5D"),
    ("Next-Action", "abc123"),
    ("X-Nextjs-Data", "1"),
    ("HX-Request", "true"),
    ("X-Inertia", "true"),
]


@pytest.mark.parametrize("name", STRIPPED)
def test_a_header_that_changes_what_the_app_believes_never_reaches_it(name):
    for spelling in (name, name.lower(), name.upper()):
        kept = header_rules.request_headers_to_forward([("Accept", "*/*"), (spelling, "evil")])
        assert kept == [("accept", "*/*")], spelling


@pytest.mark.parametrize(("name", "value"), KEPT, ids=[name for name, _ in KEPT])
def test_an_ordinary_header_reaches_the_app_unchanged(name, value):
    assert header_rules.request_headers_to_forward([(name, value)]) == [(name.lower(), value)]


def test_every_rule_is_a_lowercase_name_of_letters_digits_and_dashes():
    """Anything else could never match: names are compared in lowercase, and any other
    character is removed by the name's shape already."""
    for rule in header_rules.STRIPPED_CLASSES:
        for name_or_prefix in (*rule.names, *rule.prefixes):
            assert header_rules.NAME_SHAPE.fullmatch(name_or_prefix), name_or_prefix


def test_every_repetition_of_a_removed_header_goes_and_the_order_of_the_rest_stays():
    kept = header_rules.request_headers_to_forward(
        [
            ("Host", "wapp.localhost"),
            ("Accept", "*/*"),
            ("Host", "evil.example"),
            ("X-Forwarded-Host", "evil.example"),
            ("Range", "bytes=0-1"),
            ("x-forwarded-host", "evil.example"),
            ("Accept", "text/html"),
        ]
    )
    assert kept == [("accept", "*/*"), ("range", "bytes=0-1"), ("accept", "text/html")]


# --- through the running proxy ----------------------------------------------------------------

WSGI = "wwsgi"
# Everything but what would change how the proxy itself reads the request (framing,
# Connection, Upgrade) and the viewer cookie it needs: those have tests of their own.
PROXY_READS = header_rules.HOP_BY_HOP.names | {"cookie", "host"}
HOSTILE = [param.values[0] for param in STRIPPED if param.values[0].lower() not in PROXY_READS]
BATCH = 40  # aiohttp takes at most 128 headers in a request


@pytest.fixture
def stack():
    running = Stack()
    yield running
    running.stop()


class QuietHandler(WSGIRequestHandler):
    def log_message(self, *args):
        pass


@Request.application
def what_the_app_believes(request):
    believed = {
        "url": request.url,
        "method": request.method,
        "remote_addr": request.remote_addr,
        "script_root": request.script_root,
    }
    return Response(json.dumps(believed), content_type="application/json")


@pytest.fixture
def proxyfix_app(stack):
    """A WSGI app on wsgiref (which keeps names with `_`, as HTTP_*), behind ProxyFix
    trusting one proxy's X-Forwarded-For, -Proto, -Host, -Port and -Prefix."""
    app = ProxyFix(what_the_app_believes, x_for=1, x_proto=1, x_host=1, x_port=1, x_prefix=1)
    server = make_server("127.0.0.1", 0, app, handler_class=QuietHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    address = ("127.0.0.1", server.server_address[1])
    stack.proxy._access[(VIEWER_ID, WSGI)] = (time.monotonic() + 3600, (object(), address, False))
    yield address[1]
    server.shutdown()
    server.server_close()
    thread.join(5)


def test_the_app_receives_none_of_a_batch_of_hostile_headers_and_every_ordinary_one(stack):
    ordinary = "".join(f"{name}: {value}\r\n" for name, value in KEPT)
    for start in range(0, len(HOSTILE), BATCH):
        batch = HOSTILE[start : start + BATCH]
        hostile = "".join(f"{name}: evil.example\r\n" for name in batch)
        sock = stack.raw_socket()
        sock.sendall(
            b"GET /echo?page=1 HTTP/1.1\r\n"
            + stack.head_lines(APP)
            + f"{hostile}{ordinary}Connection: close\r\n\r\n".encode()
        )
        assert read_until_closed(sock).startswith(b"HTTP/1.1 200 OK")
        request = stack.app.received[-1]
        received = [(name.decode().lower(), value.decode()) for name, value in request.raw_headers]
        assert sorted({name for name, _ in received} & {name.lower() for name in batch}) == []
        for name, value in KEPT:
            assert (name.lower(), value) in received, name
        assert [value for name, value in received if name == "host"] == [request.host]
        assert request.host.startswith("localhost:")
        assert (request.method, request.path_qs) == ("GET", "/echo?page=1")


def test_an_app_trusting_every_forwarded_header_still_sees_the_url_the_proxy_checked(
    stack, proxyfix_app
):
    forged = {
        f"X{dash}Forwarded{dash}{field}": value
        for dash in "-_"
        for field, value in (
            ("For", "203.0.113.9"),
            ("Proto", "https"),
            ("Host", "evil.example"),
            ("Port", "8443"),
            ("Prefix", "/elsewhere"),
        )
    }
    response = stack.get("/page?x=1", label=WSGI, **forged)
    assert response.status == 200
    assert json.loads(response.read()) == {
        "url": f"http://localhost:{proxyfix_app}/page?x=1",
        "method": "GET",
        "remote_addr": "127.0.0.1",
        "script_root": "",
    }


# The proxy's own 400 page: the app's parser refuses some of these too, and its 400 must
# not pass for the proxy's.
BAD_REQUEST_PAGE = pages.page(400, "Bad request.")[1]


def assert_refused_before_the_app(stack, request: bytes) -> None:
    """The proxy answers 400 itself and closes the connection; the app reads nothing."""
    sock = stack.raw_socket()
    sock.sendall(request)
    answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 400 Bad Request")
    assert answer.endswith(BAD_REQUEST_PAGE)
    assert stack.app.received == []


# Request targets that are not a path: aiohttp (as RFC 9112 3.2.2 asks) takes an
# absolute-form target's host over the Host the proxy writes, and URL parsers (urlsplit,
# yarl, a browser following a redirect) read `//host` and `/\host` as a host.
APP_HOST = f"wapp.localhost:{PORTS.WEBAPP_PROXY}".encode()  # the app's host, as a browser sends it
NOT_A_PATH = [
    pytest.param(b"GET http://evil.example/echo", id="absolute-form http"),
    pytest.param(b"GET https://evil.example/echo", id="absolute-form https"),
    pytest.param(b"GET http://" + APP_HOST + b"/echo", id="absolute-form naming the app"),
    pytest.param(b"CONNECT evil.example:443", id="authority-form"),
    pytest.param(b"OPTIONS *", id="asterisk-form"),
    pytest.param(b"GET //evil.example/echo", id="scheme-relative //host"),
    pytest.param(b"GET /\\evil.example/echo", id="backslash /\\host"),
]

PATHS = ["/echo", "/echo?q=1", "/echo?next=//evil.example/", "/echo?next=http://evil.example/"]

BAD_HOSTS = [
    pytest.param(b"Host: " + APP_HOST + b"\r\nHost: evil.example\r\n", id="a second Host"),
    pytest.param(b"Host: evil.example\r\nHost: " + APP_HOST + b"\r\n", id="the app's second"),
    pytest.param((b"Host: " + APP_HOST + b"\r\n") * 2, id="the same Host twice"),
    pytest.param(b"", id="no Host"),
    pytest.param(b"Host: \r\n", id="an empty Host"),
    pytest.param(b"Host: " + APP_HOST + b", evil.example\r\n", id="a list of hosts"),
    pytest.param(b"Host: " + APP_HOST + b"/echo\r\n", id="a host with a path"),
    pytest.param(b"Host: evil.example@" + APP_HOST + b"\r\n", id="a host with user info"),
]


@pytest.mark.parametrize("method_and_target", NOT_A_PATH)
def test_a_request_target_other_than_a_path_is_refused_and_nothing_reaches_the_app(
    stack, method_and_target
):
    assert_refused_before_the_app(
        stack, method_and_target + b" HTTP/1.1\r\n" + stack.head_lines(APP) + b"\r\n"
    )


@pytest.mark.parametrize("target", PATHS)
def test_a_path_and_query_reach_the_app_as_sent_under_the_host_the_proxy_wrote(stack, target):
    response = stack.get(target)
    assert response.status == 200
    assert stack.app.received[-1].path_qs == target
    assert stack.app.received[-1].host.startswith("localhost:")


@pytest.mark.parametrize("hosts", BAD_HOSTS)
def test_a_request_without_exactly_one_valid_host_is_refused_and_nothing_reaches_the_app(
    stack, hosts
):
    cookie = f"Cookie: {stack.headers(APP)['Cookie']}\r\n".encode()
    assert_refused_before_the_app(stack, b"GET /echo HTTP/1.1\r\n" + hosts + cookie + b"\r\n")


def test_a_folded_header_line_is_refused_and_nothing_reaches_the_app(stack):
    sock = stack.raw_socket()
    sock.sendall(
        b"GET /echo HTTP/1.1\r\n"
        + stack.head_lines(APP)
        + b"X-Note: harmless\r\n X-Forwarded-Host: evil.example\r\n\r\n"
    )
    assert read_until_closed(sock).startswith(b"HTTP/1.1 400")
    assert stack.app.received == []
