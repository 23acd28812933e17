"""Malformed hosts, ports and schemes: the pure readers refuse each with a stable code,
and `manage.py egress_check` says so in one line. The proxy's side is in test_proxy.py."""

import pytest
from django.core.management import execute_from_command_line

from egress.decisions import (
    Refusal,
    RequestTarget,
    check_request_target,
    decide_destination,
    parse_request_target,
    parse_url,
    unreadable_request,
)
from tests.egress.test_decisions import RULES, context, resolve

MALFORMED_URLS = {
    "egress.invalid_destination": [
        # numeric spellings no resolver reads as IPv4: overflow in any base, any part
        "http://425.510.425.510/",
        "http://7147006462/",
        "http://0x41414141A9FEA9FE/",  # its low 32 bits are 169.254.169.254
        "http://4294967296/",
        "http://0x100000000/",
        "http://256.1.1.1/",
        "http://1.0x1000000/",
        "http://127.0.0.0x100/",
        "http://1.2.3.0400/",
        "http://08.0.0.1/",
        "http://1.2.3.4.5/",
        # empty, bad characters, labels and names too long, no valid IDNA
        "http:///path",
        "http://:80/",
        "http://exa mple.com/",
        "http://exa\tmple.com/",
        "http://example.com\x00/",
        "http://%31%32%37.0.0.1/",
        "http://example..com/",
        "http://" + "a" * 64 + ".example/",
        "http://" + ".".join(["a" * 63] * 4) + "/",
        "http://" + "ü" * 70 + ".example/",
        "http://\ud800.example/",
        # IPv6 literals: unclosed, trailing junk, zone ids, IPv4 or nothing inside, unbracketed
        "http://[::1/",
        "http://[::1]x/",
        "http://[fe80::1%25eth0]/",
        "http://[fe80::1%eth0]/",
        "http://[127.0.0.1]/",
        "http://[v1.fe80::a]/",
        "http://[]/",
        "http://::1/",
        "http://2001:db8::1/",
        "http://[::1]:80:80/",
        # user information, however it hides
        "http://user@example.com/",
        "http://user:password@example.com/",
        "http://@example.com/",
        "http://example.com:80@evil.example/",
        "http://example.com\\@evil.example/",
    ],
    "egress.invalid_port": [
        "http://127.0.0.1:+80/",
        "http://127.0.0.1:-80/",
        "http://example.com:-1/",
        "http://example.com:0/",
        "http://example.com:00000/",
        "http://example.com:65536/",
        "http://example.com:99999/",
        "http://example.com:4294967376/",  # 2**32 + 80
        "http://example.com:/",
        "http://example.com:8_0/",
        "http://example.com: 80/",
        "http://example.com:80 /",
        "http://example.com:0x50/",
        "http://example.com:8e1/",
        "http://example.com:80.0/",
        "http://example.com:\u0668\u0660/",  # Arabic-Indic 80, which int() reads
        "http://example.com:\uff18\uff10/",  # fullwidth 80, which int() reads
        "http://[::1]:/",
        "http://[::1]:http/",
    ],
    "egress.invalid_scheme": [
        "",
        "example.com",
        "example.com:80",
        "//example.com/",
        "/path",
        "http:/example.com/",
        "http:example.com",
        "http//example.com/",
        " http://example.com/",
        "ftp://example.com/",
        "file:///etc/passwd",
        "ws://example.com/",
        "gopher://example.com:70/",
        "httpx://example.com/",
    ],
    "egress.malformed_request": [
        "http://example.com/a b",
        "http://example.com/\x00",
        "http://example.com/a\r\nHost: evil.example",
        "http://example.com/\x7f",
        "http://example.com/?q=\t",
    ],
}


def _cases(table):
    return [(url, code) for code, urls in table.items() for url in urls]


def refusal_of(function, *args, **kwargs) -> tuple[int, str]:
    with pytest.raises(Refusal) as excinfo:
        function(*args, **kwargs)
    return excinfo.value.status, excinfo.value.code


@pytest.mark.parametrize(("url", "code"), _cases(MALFORMED_URLS))
def test_a_malformed_url_is_refused_with_a_stable_code(url, code):
    assert refusal_of(parse_url, url) == (400, code)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://example.com", ("http", "example.com", 80, "/")),
        ("HTTPS://Example.COM./a?b=c#part", ("https", "example.com", 443, "/a?b=c")),
        ("http://example.com?q", ("http", "example.com", 80, "/?q")),
        ("http://example.com:65535/", ("http", "example.com", 65535, "/")),
        ("http://example.com:00080/", ("http", "example.com", 80, "/")),
        ("http://[::1]:8080/x", ("http", "::1", 8080, "/x")),
        ("http://[::FFFF:127.0.0.1]/", ("http", "::ffff:7f00:1", 80, "/")),
        ("http://bücher.example/", ("http", "xn--bcher-kva.example", 80, "/")),
        ("http://2130706433/", ("http", "2130706433", 80, "/")),  # judged later: loopback
        ("http://example.com/café", ("http", "example.com", 80, "/café")),
        # the authority ends at the first /, ? or #, so what follows cannot move the host
        ("http://example.com#@evil.example/", ("http", "example.com", 80, "/")),
        ("http://example.com?@evil.example/", ("http", "example.com", 80, "/?@evil.example/")),
    ],
)
def test_a_well_formed_url_is_read_as_browsers_read_it(url, expected):
    assert parse_url(url) == RequestTarget(*expected)


@pytest.mark.parametrize(
    ("method", "target", "expected"),
    [
        ("CONNECT", b"example.com:443", ("", "example.com", 443, "")),
        ("CONNECT", b"[2001:DB8::1]:8443", ("", "2001:db8::1", 8443, "")),
        ("GET", b"http://example.com:8080/a?b", ("http", "example.com", 8080, "/a?b")),
        ("POST", "http://bücher.example/".encode(), ("http", "xn--bcher-kva.example", 80, "/")),
        ("GET", b"/v1/messages?beta=true", ("", None, None, "/v1/messages?beta=true")),
        ("GET", b"//evil.example/x", ("", None, None, "//evil.example/x")),  # a path
    ],
)
def test_a_request_line_target_is_read_by_its_form(method, target, expected):
    assert parse_request_target(method, target) == RequestTarget(*expected)


@pytest.mark.parametrize(
    ("method", "target", "code"),
    [
        ("CONNECT", b"example.com", "egress.invalid_port"),
        ("CONNECT", b"example.com:", "egress.invalid_port"),
        ("CONNECT", b"example.com:+443", "egress.invalid_port"),
        ("CONNECT", b"example.com:0", "egress.invalid_port"),
        ("CONNECT", b"example.com:65536", "egress.invalid_port"),
        ("CONNECT", b"[::1]", "egress.invalid_port"),
        ("CONNECT", b"::1:443", "egress.invalid_destination"),
        ("CONNECT", b"[::1:443", "egress.invalid_destination"),
        ("CONNECT", b"user@example.com:443", "egress.invalid_destination"),
        ("CONNECT", b"0x41414141A9FEA9FE:443", "egress.invalid_destination"),
        ("CONNECT", b"http://example.com:443", "egress.invalid_destination"),
        ("CONNECT", b":443", "egress.invalid_destination"),
        ("GET", b"https://example.com/", "egress.invalid_scheme"),  # would go unencrypted
        ("GET", b"example.com:80", "egress.invalid_scheme"),
        ("OPTIONS", b"*", "egress.invalid_scheme"),
        ("GET", b"http://example.com:8_0/", "egress.invalid_port"),
        ("GET", b"http://user:pw@example.com/", "egress.invalid_destination"),
        ("GET", b"http://\xff.example/", "egress.malformed_request"),
        ("GET", b"/a\x00b", "egress.malformed_request"),
        ("GET", b"/a\rb", "egress.malformed_request"),
    ],
)
def test_a_malformed_request_line_target_is_refused_with_a_stable_code(method, target, code):
    assert refusal_of(parse_request_target, method, target) == (400, code)


@pytest.mark.parametrize(
    ("part", "named"),
    [
        ("request_line", "request line"),
        ("headers", "header line"),
        ("body", "chunked encoding"),
        (None, "whole URL"),
    ],
)
def test_a_request_the_proxy_cannot_read_is_refused_naming_the_part_that_broke(part, named):
    refusal = unreadable_request(part)
    assert (refusal.status, refusal.code) == (400, "egress.malformed_request")
    assert named in refusal.reason


@pytest.mark.parametrize(
    "host", ["425.510.425.510", "7147006462", "0x41414141A9FEA9FE", "[::1", "example.com:443"]
)
def test_deciding_a_malformed_host_refuses_it_instead_of_raising(host):
    assert refusal_of(decide_destination, context(), RULES, host, 80, resolve) == (
        400,
        "egress.invalid_destination",
    )


@pytest.mark.parametrize(
    ("intercepted", "request_host", "host_header", "code"),
    [
        (False, "example.com", "example.com:+80", "egress.invalid_port"),
        (False, "example.com", "example.com:0", "egress.invalid_port"),
        (False, "example.com", "exa mple.com", "egress.invalid_destination"),
        (False, "example.com", "user@example.com", "egress.invalid_destination"),
        (False, "example.com", "", "egress.invalid_destination"),
        (False, None, "example.com", "egress.malformed_request"),  # a path on a plain connection
        (True, None, "api.anthropic.com:99999", "egress.invalid_port"),
        (True, None, "api.anthropic.com:443@evil.example", "egress.invalid_destination"),
        (True, None, "api.anthropic.com:443:443", "egress.invalid_destination"),
    ],
)
def test_a_malformed_host_header_or_target_on_a_connection_is_refused(
    intercepted, request_host, host_header, code
):
    port = 443 if intercepted else 80
    destination = decide_destination(
        context(), RULES, "api.anthropic.com" if intercepted else "example.com", port, resolve
    )
    assert refusal_of(
        check_request_target,
        destination,
        request_host=request_host,
        request_port=port,
        host_header=host_header,
        intercepted=intercepted,
    ) == (400, code)


@pytest.mark.parametrize("host_header", ["API.Anthropic.COM.", "api.anthropic.com:443"])
def test_inside_intercepted_tls_any_spelling_of_the_connect_target_is_the_same_host(host_header):
    destination = decide_destination(context(), RULES, "api.anthropic.com", 443, resolve)
    check_request_target(
        destination,
        request_host=None,
        request_port=None,
        host_header=host_header,
        intercepted=True,
    )


@pytest.mark.parametrize(("url", "code"), _cases(MALFORMED_URLS))
def test_egress_check_refuses_a_malformed_url_in_one_line(url, code, capsys):
    with pytest.raises(SystemExit) as excinfo:
        execute_from_command_line(["manage.py", "egress_check", "--user", "owner@acme.test", url])
    out, err = capsys.readouterr()
    assert excinfo.value.code == 1
    assert out == ""
    assert err.startswith(f"CommandError: {code}: ")
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err
