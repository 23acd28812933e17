"""The web app proxy's pure decisions about a visitor, by table."""

import pytest

from webapps import gate

FRONT = gate.trusted_networks(["10.0.0.5", "10.1.0.0/16", "fd00::/8"])


@pytest.mark.parametrize(
    ("peer", "forwarded_for", "visitor"),
    [
        # No front proxy trusted for this peer: its own address, whatever it claims.
        ("203.0.113.9", ["198.51.100.1"], "203.0.113.9"),
        ("10.0.0.6", ["198.51.100.1"], "10.0.0.6"),
        # A trusted front proxy: the address it appended.
        ("10.0.0.5", ["198.51.100.1"], "198.51.100.1"),
        ("10.0.0.5", [" 198.51.100.1 "], "198.51.100.1"),
        # What the visitor sent before is theirs to forge and never read.
        ("10.0.0.5", ["1.2.3.4, 198.51.100.1"], "198.51.100.1"),
        ("10.0.0.5", ["1.2.3.4", "198.51.100.1"], "198.51.100.1"),
        # A chain of trusted proxies: past each of them.
        ("10.0.0.5", ["1.2.3.4, 198.51.100.1, 10.1.2.3"], "198.51.100.1"),
        ("fd00::1", ["2001:db8::7, 10.0.0.5"], "2001:db8::7"),
        # Nothing forwarded, or only trusted hops: the last trusted hop.
        ("10.0.0.5", [], "10.0.0.5"),
        ("10.0.0.5", ["10.1.2.3"], "10.1.2.3"),
        # An entry that is no address stops the walk at the last trusted hop.
        ("10.0.0.5", ["198.51.100.1, unknown"], "10.0.0.5"),
        ("10.0.0.5", ["198.51.100.1, 10.1.2.3, _hidden"], "10.0.0.5"),
        ("10.0.0.5", ["unknown, 10.1.2.3"], "10.1.2.3"),
    ],
)
def test_the_visitors_address_is_read_past_trusted_front_proxies_only(peer, forwarded_for, visitor):
    assert gate.client_address(peer, forwarded_for, FRONT) == visitor


def test_without_trusted_proxies_x_forwarded_for_is_never_read():
    assert gate.client_address("127.0.0.1", ["198.51.100.1"], ()) == "127.0.0.1"


@pytest.mark.parametrize(
    ("address", "key"),
    [
        ("198.51.100.1", "198.51.100.1"),
        ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:bbbb::9", "2001:db8:1:2::/64"),
        ("::ffff:198.51.100.1", "198.51.100.1"),
        ("", ""),
    ],
)
def test_sign_in_attempts_are_counted_per_ipv4_address_and_per_ipv6_64(address, key):
    assert gate.attempts_key(address) == key


def test_a_trusted_proxy_entry_that_is_no_address_is_named():
    with pytest.raises(ValueError, match=r"'proxy\.example'"):
        gate.trusted_networks(["10.0.0.5", "proxy.example"])
