"""Which destination addresses the egress proxy may connect to.

Standard library only: this module must not import Django.

`ipaddress` cannot be trusted on its own for this decision:

- `is_private` is False for carrier-grade NAT 100.64.0.0/10 (home of Alibaba's metadata service),
  and `is_global` is True for multicast, site-local fec0::/10, IPv4-compatible ::a.b.c.d and NAT64.
- The CVE-2024-4032 backport changed `is_private`/`is_global` for 192.0.0.0/24, 2001::/23,
  64:ff9b:1::/48 and 2002::/16 between Python 3.11.x builds (Debian 3.11.2 has it, 3.11.7 not).
- IPv6 forms that embed an IPv4 address (mapped, compatible, NAT64, 6to4, Teredo) are judged by
  their IPv6 prefix, so ::ffff:127.0.0.1 is not `is_loopback`.
- `ipaddress.ip_address` rejects spellings the system resolver accepts (127.1, 0177.0.0.1,
  2130706433), so "not an IP, so it is a name" lets them through.

So an explicit deny list decides first (every range whose flags differ between patch levels is on
it), IPv6 forms that embed an IPv4 address are judged by the embedded address, and the `ipaddress`
flags only add a final `reserved` refusal.
"""

import ipaddress
import re
import socket
from collections.abc import Callable

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
_Extractor = Callable[[ipaddress.IPv6Address], ipaddress.IPv4Address]


class InvalidHost(ValueError):
    """A host that is not a valid DNS name or IP literal."""


_NAME = re.compile(r"[a-z0-9._-]+")
# Dot-separated decimal, octal or 0x-hex numbers: the spellings inet_aton may read as IPv4.
_NUMERIC_IPV4 = re.compile(r"(?:0x[0-9a-f]*|[0-9]+)(?:\.(?:0x[0-9a-f]*|[0-9]+))*")


def parse_host(host: str) -> str:
    """Normalise a CONNECT authority or URL host; IPv6 literals come back bare and compressed."""
    if host.startswith("[") and host.endswith("]"):
        return _parse_ipv6(host[1:-1])
    if ":" in host:
        return _parse_ipv6(host)
    name = host.removesuffix(".").lower()
    if not name.isascii():
        try:
            name = name.encode("idna").decode("ascii")
        except UnicodeError as error:
            raise InvalidHost(f"not a valid internationalised name: {host!r}") from error
    if not _NAME.fullmatch(name) or len(name) > 253:
        raise InvalidHost(f"not a valid host: {host!r}")
    if any(not 1 <= len(label) <= 63 for label in name.split(".")):
        raise InvalidHost(f"empty or too long label: {host!r}")
    return name


def _parse_ipv6(text: str) -> str:
    if "%" in text:
        raise InvalidHost(f"IPv6 zone ids are refused: {text!r}")
    try:
        return str(ipaddress.IPv6Address(text))
    except ValueError as error:
        raise InvalidHost(f"not a valid IPv6 literal: {text!r}") from error


def numeric_address(host: str) -> Address | None:
    """The address a numeric host denotes as the system resolver reads it; None for a DNS name."""
    name = parse_host(host)
    if ":" in name:
        return ipaddress.IPv6Address(name)
    if not _NUMERIC_IPV4.fullmatch(name):
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(name))
    except OSError as error:
        raise InvalidHost(f"numeric host that is not an IPv4 address: {host!r}") from error


def _low_32_bits(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address:
    return ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF)


def _teredo_client(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address:
    # The client's public address, where the relay delivers packets. Only called inside 2001::/32.
    return address.teredo[1]


def _sixtofour_router(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address:
    return address.sixtofour  # only called inside 2002::/16, where it is never None


# First match wins, so specific entries come before the ranges that contain them.
_DENY = [
    (ipaddress.ip_network(network), reason)
    for network, reason in (
        ("100.100.100.200/32", "metadata"),  # Alibaba Cloud, inside CGNAT
        ("168.63.129.16/32", "metadata"),  # Azure WireServer: a global address, never a destination
        ("0.0.0.0/8", "this_network"),
        ("10.0.0.0/8", "private"),
        ("100.64.0.0/10", "carrier_grade_nat"),
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link_local"),  # includes 169.254.169.254 (AWS, GCP, Azure metadata)
        ("172.16.0.0/12", "private"),
        ("192.0.0.0/24", "ietf_protocol"),
        ("192.0.2.0/24", "documentation"),
        ("192.88.99.0/24", "6to4_relay"),
        ("192.168.0.0/16", "private"),
        ("198.18.0.0/15", "benchmarking"),
        ("198.51.100.0/24", "documentation"),
        ("203.0.113.0/24", "documentation"),
        ("224.0.0.0/4", "multicast"),
        ("255.255.255.255/32", "broadcast"),
        ("240.0.0.0/4", "reserved"),
        ("::/128", "unspecified"),
        ("::1/128", "loopback"),
        ("::/96", "reserved"),  # IPv4-compatible
        ("64:ff9b::/96", "nat64"),
        ("64:ff9b:1::/48", "nat64"),
        ("100::/64", "reserved"),  # discard-only
        ("2001::/32", "teredo"),
        ("2001:2::/48", "benchmarking"),
        ("2001::/23", "ietf_protocol"),
        ("2001:db8::/32", "documentation"),
        ("2002::/16", "6to4"),
        ("3fff::/20", "documentation"),
        ("5f00::/16", "reserved"),  # SRv6 SIDs
        ("fd00:ec2::254/128", "metadata"),  # AWS IMDS over IPv6, inside unique local
        ("fc00::/7", "unique_local"),
        ("fe80::/10", "link_local"),
        ("fec0::/10", "site_local"),
        ("ff00::/8", "multicast"),
    )
]

# Ranges whose addresses carry an IPv4 address: a non-global one gives its own reason instead.
_EMBEDDED_IPV4: dict[ipaddress.IPv6Network, _Extractor] = {
    ipaddress.IPv6Network("::/96"): _low_32_bits,
    ipaddress.IPv6Network("64:ff9b::/96"): _low_32_bits,
    # RFC 8215 lets operators pick any NAT64 prefix in this /48; deployments use a /96.
    ipaddress.IPv6Network("64:ff9b:1::/48"): _low_32_bits,
    ipaddress.IPv6Network("2001::/32"): _teredo_client,
    ipaddress.IPv6Network("2002::/16"): _sixtofour_router,
}


def blocked_reason(address: Address) -> str | None:
    """None for a global unicast address the proxy may connect to, else why it is refused."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return blocked_reason(address.ipv4_mapped)
    for network, reason in _DENY:
        if address in network:
            extract = _EMBEDDED_IPV4.get(network)
            embedded_reason = blocked_reason(extract(address)) if extract else None
            return embedded_reason or reason
    if (
        not address.is_global
        or address.is_multicast
        or address.is_reserved
        or address.is_link_local
        or address.is_unspecified
        or address.is_loopback
    ):
        return "reserved"
    return None
