"""The TLS state the proxy keeps across connections: the contexts of intercepted hosts
(reused for the same host, never serving one host's certificate for another, bounded,
trusted by a client that trusts only the proxy's CA, as a sandbox does)."""

import ssl

import pytest

from egress import ca, tls


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return ca.ensure_ca(tmp_path_factory.mktemp("egress-ca"))


@pytest.fixture
def leaves(files):
    return tls.LeafContexts(files, size=2)


def handshake(server_context: ssl.SSLContext, files, server_name: str) -> dict:
    """A TLS handshake in memory, as a sandbox client trusting only the proxy's CA;
    returns the certificate the client accepted."""
    client_context = ssl.create_default_context(cafile=str(files.cert))
    client_in, client_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    server_in, server_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_context.wrap_bio(client_in, client_out, server_hostname=server_name)
    server = server_context.wrap_bio(server_in, server_out, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(10):
        for name, side in (("client", client), ("server", server)):
            if not done[name]:
                try:
                    side.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
        server_in.write(client_out.read())
        client_in.write(server_out.read())
        if all(done.values()):
            return client.getpeercert()
    raise AssertionError("the handshake did not finish")


def names(certificate: dict) -> set[str]:
    return {value for _, value in certificate["subjectAltName"]}


def test_a_host_gets_a_certificate_for_itself_alone_that_a_sandbox_trusts(leaves, files):
    assert names(handshake(leaves.context_for("api.github.test"), files, "api.github.test")) == {
        "api.github.test"
    }


def test_one_hosts_context_is_never_accepted_for_another_host(leaves, files):
    leaves.context_for("api.github.test")
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(leaves.context_for("api.github.test"), files, "evil.test")
    assert names(handshake(leaves.context_for("evil.test"), files, "evil.test")) == {"evil.test"}


def test_the_same_host_reuses_its_context(leaves):
    assert leaves.context_for("api.github.test") is leaves.context_for("api.github.test")
    assert leaves.context_for("api.github.test") is not leaves.context_for("slack.test")


def test_an_ip_address_host_gets_an_ip_address_certificate(leaves, files):
    assert names(handshake(leaves.context_for("192.0.2.7"), files, "192.0.2.7")) == {"192.0.2.7"}


def test_the_cache_is_bounded_and_a_dropped_host_gets_a_new_context_for_itself(leaves, files):
    first = leaves.context_for("one.test")
    leaves.context_for("two.test")
    leaves.context_for("three.test")  # the size is 2: one.test, least recently used, goes
    again = leaves.context_for("one.test")
    assert again is not first
    assert names(handshake(again, files, "one.test")) == {"one.test"}


def test_an_old_context_is_replaced_with_a_freshly_issued_leaf(leaves, monkeypatch):
    first = leaves.context_for("api.github.test")
    monkeypatch.setattr(tls, "LEAF_REISSUE_SECONDS", 0)
    assert leaves.context_for("api.github.test") is not first
