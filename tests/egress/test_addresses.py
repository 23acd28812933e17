"""Which destinations the egress proxy refuses. Pure Python: no Django, no database."""

from ipaddress import ip_address

import pytest

from egress.addresses import (
    InvalidHost,
    blocked_reason,
    numeric_address,
    parse_host,
)

BLOCKED = {
    "loopback": ["127.0.0.1", "127.255.255.254", "::1"],
    "private": ["10.0.0.1", "172.16.0.1", "172.31.255.255", "192.168.1.1"],
    "carrier_grade_nat": ["100.64.0.1", "100.127.255.255"],
    "link_local": ["169.254.169.254", "169.254.0.1", "fe80::1", "febf::1"],
    "unique_local": ["fc00::1", "fd12:3456::1"],
    "site_local": ["fec0::1", "feff::1"],
    "multicast": ["224.0.0.1", "239.255.255.250", "ff02::1", "ff0e::1"],
    "reserved": ["240.0.0.1", "254.255.255.255", "100::1", "5f00::1", "4000::1"],
    "unspecified": ["::", "0:0:0:0:0:0:0:0"],
    "documentation": [
        "192.0.2.1",
        "198.51.100.7",
        "203.0.113.9",
        "2001:db8::1",
        "3fff::1",
    ],
    "benchmarking": ["198.18.0.1", "198.19.255.255", "2001:2::1"],
    "this_network": ["0.0.0.0", "0.1.2.3"],  # noqa: S104
    "broadcast": ["255.255.255.255", "::ffff:255.255.255.255"],
    "ietf_protocol": ["192.0.0.9", "192.0.0.170", "2001:1::1", "2001:20::1"],
    "6to4_relay": ["192.88.99.1", "192.88.99.254"],
    "metadata": ["100.100.100.200", "fd00:ec2::254"],
}

# IPv6 forms that carry an IPv4 address: a non-global embedded address gives its own reason.
EMBEDDED_BLOCKED = {
    "::ffff:127.0.0.1": "loopback",
    "::ffff:10.0.0.1": "private",
    "::ffff:169.254.169.254": "link_local",
    "::ffff:100.100.100.200": "metadata",
    "::127.0.0.1": "loopback",
    "::10.0.0.1": "private",
    "64:ff9b::7f00:1": "loopback",
    "64:ff9b::a9fe:a9fe": "link_local",
    "64:ff9b:1::a00:1": "private",
    "2002:7f00:1::1": "loopback",
    "2002:a9fe:a9fe::1": "link_local",
    # RFC 4380's example: server 65.54.227.120, client 192.0.2.45 (obfuscated as 3fff:fdd2).
    "2001:0:4136:e378:8000:63bf:3fff:fdd2": "documentation",
    "2001:0:4136:e378:8000:63bf:80ff:fffe": "loopback",  # client 127.0.0.1
}

# A transition mechanism is never legitimate sandbox egress, even to a global IPv4 address.
EMBEDDED_GLOBAL = {
    "::8.8.8.8": "reserved",
    "64:ff9b::808:808": "nat64",
    "64:ff9b:1::808:808": "nat64",
    "2002:0808:0808::1": "6to4",
    "2001:0:4136:e378:8000:63bf:f7f7:f7f7": "teredo",  # client 8.8.8.8
}

ALLOWED = [
    "8.8.8.8",
    "1.1.1.1",
    "93.184.216.34",
    "2606:4700:4700::1111",
    "2a00:1450:4001:82b::200e",
    "::ffff:8.8.8.8",
]


def _cases(table):
    return [(address, reason) for reason, addresses in table.items() for address in addresses]


@pytest.mark.parametrize(("address", "reason"), _cases(BLOCKED))
def test_non_global_addresses_are_refused_with_their_category(address, reason):
    assert blocked_reason(ip_address(address)) == reason
    assert blocked_reason(ip_address(address)) is not None


@pytest.mark.parametrize(("address", "reason"), EMBEDDED_BLOCKED.items())
def test_ipv6_forms_are_judged_by_the_ipv4_address_they_embed(address, reason):
    assert blocked_reason(ip_address(address)) == reason


@pytest.mark.parametrize(("address", "reason"), EMBEDDED_GLOBAL.items())
def test_transition_mechanisms_are_refused_even_towards_a_global_address(address, reason):
    assert blocked_reason(ip_address(address)) == reason


@pytest.mark.parametrize("address", ALLOWED)
def test_global_unicast_addresses_are_allowed(address):
    assert blocked_reason(ip_address(address)) is None
    assert blocked_reason(ip_address(address)) is None


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("192.0.0.9", "ietf_protocol"),
        ("192.0.0.10", "ietf_protocol"),
        ("2001:1::2", "ietf_protocol"),
        ("2001:3::1", "ietf_protocol"),
        ("2001:4:112::1", "ietf_protocol"),
        ("2001:30::1", "ietf_protocol"),
        ("64:ff9b:1::808:808", "nat64"),
        ("2002:808:808::1", "6to4"),
    ],
)
def test_ranges_the_cve_2024_4032_backport_changed_are_decided_by_the_deny_list(address, reason):
    assert blocked_reason(ip_address(address)) == reason


@pytest.mark.parametrize(
    ("host", "address", "reason"),
    [
        ("127.1", "127.0.0.1", "loopback"),
        ("0177.0.0.1", "127.0.0.1", "loopback"),
        ("0x7f.0.0.1", "127.0.0.1", "loopback"),
        ("0X7F.0.0.1", "127.0.0.1", "loopback"),
        ("0x7f000001", "127.0.0.1", "loopback"),
        ("2130706433", "127.0.0.1", "loopback"),
        ("127.0.0.1.", "127.0.0.1", "loopback"),
        ("127\u30020\u30020\u30021", "127.0.0.1", "loopback"),  # ideographic full stops
        ("\uff11\uff12\uff17.0.0.1", "127.0.0.1", "loopback"),  # fullwidth digits
        ("0", "0.0.0.0", "this_network"),  # noqa: S104
        ("169.254.43518", "169.254.169.254", "link_local"),
        ("[::1]", "::1", "loopback"),
        ("::ffff:7f00:1", "::ffff:127.0.0.1", "loopback"),
        ("[::FFFF:127.0.0.1]", "::ffff:127.0.0.1", "loopback"),
        ("8.8.8.8", "8.8.8.8", None),
    ],
)
def test_numeric_hosts_are_read_the_way_the_system_resolver_reads_them(host, address, reason):
    assert numeric_address(host) == ip_address(address)
    assert blocked_reason(numeric_address(host)) == reason


@pytest.mark.parametrize(
    "host", ["example.com", "cafe", "1.2.3.4.example.com", "localhost", "0x7f.example", "1e100.net"]
)
def test_names_are_left_to_dns(host):
    assert numeric_address(host) is None


@pytest.mark.parametrize(
    "host",
    [
        "[fe80::1%eth0]",
        "fe80::1%25eth0",
        "08.0.0.1",  # not valid octal
        "256.1.1.1",
        "4294967296",
        "1.2.3.4.5",
        "127.1 foo",  # inet_aton alone would stop at the space and accept it
    ],
)
def test_malformed_numeric_hosts_are_invalid(host):
    with pytest.raises(InvalidHost):
        numeric_address(host)


@pytest.mark.parametrize(
    ("host", "normalised"),
    [
        ("Example.COM", "example.com"),
        ("example.com.", "example.com"),
        ("_dmarc.example.com", "_dmarc.example.com"),
        ("bücher.example", "xn--bcher-kva.example"),
        ("BÜCHER.example.", "xn--bcher-kva.example"),
        ("[::1]", "::1"),
        ("[2001:DB8:0:0::1]", "2001:db8::1"),
        ("2001:db8::1", "2001:db8::1"),
        ("a" * 63 + ".example", "a" * 63 + ".example"),
    ],
)
def test_hosts_are_normalised(host, normalised):
    assert parse_host(host) == normalised


@pytest.mark.parametrize(
    "host",
    [
        "",
        ".",
        "example..com",
        ".example.com",
        "example.com..",
        "exa mple.com",
        "example.com:443",
        "user@example.com",
        "exam/ple.com",
        "[127.0.0.1]",
        "[::1",
        "[fe80::1%eth0]",
        "a" * 64 + ".example",
        ".".join(["a" * 63] * 4),  # 255 characters
        "x" * 64 + "ü.example",
    ],
)
def test_invalid_hosts_are_refused(host):
    with pytest.raises(InvalidHost):
        parse_host(host)


def test_invalid_host_is_a_value_error():
    assert issubclass(InvalidHost, ValueError)
