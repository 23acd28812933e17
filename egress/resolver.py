"""Name resolution for the proxy: every address of a name, looked up once.

By default the system resolver (getaddrinfo); with QUOR_EGRESS_DNS_SERVER, that
server is asked directly (A and AAAA), which is also how tests serve names that
resolve to private addresses or change between lookups. Answers from that server are
kept for their TTL (at most a minute), as a caching stub resolver keeps them: two
queries cost a new connection about half a millisecond of the proxy's CPU. A kept
answer is checked again at each use like a fresh one, and an answer with TTL 0, the
DNS rebinding trick, is never kept.
"""

import ipaddress
import socket
import time
from collections.abc import Callable

import dns.exception
import dns.message
import dns.query
import dns.rdatatype

from egress.decisions import Address, Resolver
from egress.lru import LruCache

ANSWERS_KEPT = 4096
ANSWER_KEPT_AT_MOST_S = 60


def system_resolver(host: str) -> list[Address]:
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise LookupError(exc.strerror) from None
    return list(dict.fromkeys(ipaddress.ip_address(info[4][0]) for info in infos))


def dns_server_resolver(
    server: str, timeout: float = 3.0, clock: Callable[[], float] = time.monotonic
) -> Resolver:
    server_host, _, server_port = server.rpartition(":")
    kept = LruCache(ANSWERS_KEPT)  # name -> (kept until, addresses)

    def ask(host: str) -> tuple[list[Address], int]:
        """Every address of `host` and the shortest TTL of the records that gave them."""
        addresses: list[Address] = []
        ttls = []
        for record_type in (dns.rdatatype.A, dns.rdatatype.AAAA):
            query = dns.message.make_query(host, record_type)
            try:
                answer = dns.query.udp(query, server_host, port=int(server_port), timeout=timeout)
            except (dns.exception.DNSException, OSError) as exc:
                raise LookupError(f"DNS server {server} did not answer: {exc}") from None
            for rrset in answer.answer:
                ttls.append(rrset.ttl)
                addresses.extend(
                    ipaddress.ip_address(record.address)
                    for record in rrset
                    if record.rdtype in (dns.rdatatype.A, dns.rdatatype.AAAA)
                )
        if not addresses:
            raise LookupError("no such name")
        return list(dict.fromkeys(addresses)), min(ttls)

    def resolve(host: str) -> list[Address]:
        found = kept.get(host)
        if found is not None and clock() < found[0]:
            return found[1]
        addresses, ttl = ask(host)
        if ttl > 0:
            kept.put(host, (clock() + min(ttl, ANSWER_KEPT_AT_MOST_S), addresses))
        return addresses

    return resolve


def make_resolver(dns_server: str) -> Resolver:
    return dns_server_resolver(dns_server) if dns_server else system_resolver
