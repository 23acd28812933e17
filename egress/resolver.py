"""Name resolution for the proxy: every address of a name, looked up once.

By default the system resolver (getaddrinfo); with QUOR_EGRESS_DNS_SERVER, that
server is asked directly (A and AAAA), which is also how tests serve names that
resolve to private addresses or change between lookups.
"""

import ipaddress
import socket

import dns.exception
import dns.message
import dns.query
import dns.rdatatype

from egress.decisions import Address, Resolver


def system_resolver(host: str) -> list[Address]:
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise LookupError(exc.strerror) from None
    return list(dict.fromkeys(ipaddress.ip_address(info[4][0]) for info in infos))


def dns_server_resolver(server: str, timeout: float = 3.0) -> Resolver:
    server_host, _, server_port = server.rpartition(":")

    def resolve(host: str) -> list[Address]:
        addresses: list[Address] = []
        for record_type in (dns.rdatatype.A, dns.rdatatype.AAAA):
            query = dns.message.make_query(host, record_type)
            try:
                answer = dns.query.udp(query, server_host, port=int(server_port), timeout=timeout)
            except (dns.exception.DNSException, OSError) as exc:
                raise LookupError(f"DNS server {server} did not answer: {exc}") from None
            for rrset in answer.answer:
                addresses.extend(
                    ipaddress.ip_address(record.address)
                    for record in rrset
                    if record.rdtype in (dns.rdatatype.A, dns.rdatatype.AAAA)
                )
        if not addresses:
            raise LookupError("no such name")
        return list(dict.fromkeys(addresses))

    return resolve


def make_resolver(dns_server: str) -> Resolver:
    return dns_server_resolver(dns_server) if dns_server else system_resolver
