"""The proxy.py code the egress proxy replaces at run time, or whose behaviour its
replacements and its connection handler rely on, is the code they were written and
tested against: an upgrade of proxy.py that changes one of these methods fails here,
in CI, instead of silently losing a protection (a body cap, the strict request
targets, upstream verification, the sandbox-side handshake's deadline, the answers
to unreadable requests).

Each method is fingerprinted by its syntax tree, read from proxy.py's installed source
(not from the class, which the proxy's set-up patches): comments and layout do not
count, code does. When one fails, read proxy.py's new code for what `relied_on` says,
fix the replacement if it no longer holds, run tests/egress, then take the new
fingerprint from the failure message. docs/decisions.md (2026-12-07, "proxy.py's
internals") says why each replacement exists."""

import ast
import hashlib
import importlib
import inspect

import pytest

# (module, class, method): (fingerprint, what Quor relies on)
CHECKED = {
    ("proxy.http.parser.parser", "HttpParser", "_process_body"): (
        "bf559c895044b870",
        "cap_request_bodies wraps it: every body byte of a request passes through it"
        " before it is buffered, the first request's and a kept-alive one's alike.",
    ),
    ("proxy.http.parser.parser", "HttpParser", "set_url"): (
        "1328c6036f849f4f",
        "read_request_targets replaces it: it alone reads a request line's target into"
        " _url (then _set_line_attributes), and takes (url, allowed_url_schemes).",
    ),
    ("proxy.http.parser.parser", "HttpParser", "_process_line"): (
        "cee1965af633817a",
        "calls set_url for every request line, after setting method and CONNECT.",
    ),
    ("proxy.http.parser.parser", "HttpParser", "_set_line_attributes"): (
        "4c40beb342c1c16f",
        "read_request_targets calls it: host, port and path come from _url alone.",
    ),
    ("proxy.core.connection.server", "TcpServerConnection", "wrap"): (
        "eb91932f6a02f13b",
        "reuse_upstream_tls_contexts replaces it with the same steps (a verifying"
        " context from ca_file, blocking handshake, _conn swapped, non-blocking after)"
        " and a kept context and session.",
    ),
    ("proxy.core.connection.connection", "TcpConnection", "recv"): (
        "98ec6a8bf144bea5",
        "reuse_upstream_tls_contexts wraps it (as TcpServerConnection.recv): None at"
        " the peer's end, the bytes otherwise.",
    ),
    ("proxy.http.proxy.server", "HttpProxyPlugin", "wrap_server"): (
        "4a63bcc633ad43ce",
        "the one caller of TcpServerConnection.wrap: the destination's host name for"
        " verification, --ca-file, as_non_blocking, CERT_REQUIRED.",
    ),
    ("proxy.http.proxy.server", "HttpProxyPlugin", "wrap_client"): (
        "e1dca0fc988c878c",
        "serve_intercepted_tls_from_cache replaces it: True means tear down, and it"
        " swaps the client's socket (_conn) for the TLS one.",
    ),
    ("proxy.http.proxy.server", "HttpProxyPlugin", "intercept"): (
        "1baaabe074547138",
        "calls wrap_server, then wrap_client, and hands the client's new socket to the plugins.",
    ),
    ("proxy.core.connection.client", "TcpClientConnection", "wrap"): (
        "0c7379cb90aa65bd",
        "what serve_intercepted_tls_from_cache's wrap_client does in its place: flush"
        " the CONNECT answer, handshake, _conn swapped, non-blocking after.",
    ),
    ("proxy.http.proxy.server", "HttpProxyPlugin", "on_client_data"): (
        "dfaf78b9f81575fb",
        "EgressProtocolHandler: a later request on the connection is parsed into"
        " pipeline_request, which is kept as it was when parsing raises.",
    ),
    ("proxy.http.handler", "HttpProtocolHandler", "handle_data"): (
        "f6a850e6622d104d",
        "EgressProtocolHandler overrides it: until the first request is complete there"
        " is no plugin, after it every byte goes to plugin.on_client_data.",
    ),
    ("proxy.http.handler", "HttpProtocolHandler", "_parse_first_request"): (
        "cbacb05fc888130b",
        "EgressProtocolHandler: a first request proxy.py refuses leaves no plugin and"
        " its bare 400 as the last queued answer, which the handler replaces.",
    ),
}


def fingerprint(module_name: str, class_name: str, method: str) -> str:
    module = importlib.import_module(module_name)
    tree = ast.parse(inspect.getsource(module))
    [klass] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name]
    [function] = [n for n in klass.body if getattr(n, "name", None) == method]
    return hashlib.sha256(ast.dump(function).encode()).hexdigest()[:16]


@pytest.mark.parametrize(
    ("where", "checked"), [pytest.param(w, c, id=".".join(w[1:])) for w, c in CHECKED.items()]
)
def test_proxy_py_code_the_egress_proxy_replaces_or_relies_on_is_unchanged(where, checked):
    expected, relied_on = checked
    found = fingerprint(*where)
    assert found == expected, (
        f"proxy.py's {'.'.join(where[1:])} changed (fingerprint {found}). Quor relies on"
        f" this: {relied_on} Check it still holds, then update the fingerprint."
    )
