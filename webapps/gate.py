"""What the web app proxy decides about a visitor from the facts of a request alone:
pure functions over plain data, no Django (an import contract keeps it so), driven by
tables in tests/webapps/test_gate.py. `webapps/proxy.py` gathers the facts and acts."""

import ipaddress
from collections.abc import Iterable

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def trusted_networks(entries: Iterable[str]) -> tuple[Network, ...]:
    """The front proxies' addresses or networks (`10.0.0.5`, `10.0.0.0/24`, `fd00::/8`);
    ValueError names an entry that is neither."""
    networks = []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry.strip(), strict=False))
        except ValueError:
            raise ValueError(f"not an address or network: {entry!r}") from None
    return tuple(networks)


def _address(text: str):
    try:
        return ipaddress.ip_address(text.strip())
    except ValueError:
        return None


def client_address(peer: str, forwarded_for: Iterable[str], trusted: tuple[Network, ...]) -> str:
    """The visitor's address. The connection's, unless it comes from a trusted front
    proxy: then X-Forwarded-For is read from its end (each proxy appends the address it
    saw) past every trusted proxy, and the first address that is not one is the
    visitor's. What comes before it is the visitor's to forge, and is never read; an
    entry that is not an address stops the walk at the last trusted hop."""
    address = _address(peer)
    if address is None or not _trusted(address, trusted):
        return peer
    hops = [hop for value in forwarded_for for hop in value.split(",")]
    for hop in reversed(hops):
        seen = _address(hop)
        if seen is None:
            break
        address = seen
        if not _trusted(seen, trusted):
            break
    return str(address)


def _trusted(address, trusted: tuple[Network, ...]) -> bool:
    return any(address in network for network in trusted)


def attempts_key(address: str) -> str:
    """Whose sign-in attempts are counted together: an IPv4 address, or an IPv6
    address's /64 (one subscriber's, which it can fill with addresses at will)."""
    parsed = _address(address)
    if parsed is None:
        return address
    if isinstance(parsed, ipaddress.IPv6Address):
        if parsed.ipv4_mapped is not None:
            return str(parsed.ipv4_mapped)
        return str(ipaddress.ip_network(f"{parsed}/64", strict=False))
    return str(parsed)
