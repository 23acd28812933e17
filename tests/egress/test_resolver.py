"""The proxy's DNS answers from its configured server: kept for their TTL (at most a
minute), never when the TTL is 0, and a name that stops resolving fails again."""

import ipaddress

import pytest

from egress import resolver
from tests.fakes import FakeDnsServer


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture
def dns_server():
    server = FakeDnsServer("127.0.0.1", 0)  # a port of its own
    yield server, f"127.0.0.1:{server.sock.getsockname()[1]}"
    server.close()


@pytest.fixture
def clock():
    return Clock()


def test_an_answer_is_kept_for_its_ttl_then_asked_again(dns_server, clock):
    server, address = dns_server
    server.records["kept.test"] = ["192.0.2.10"]
    server.ttls["kept.test"] = 30
    resolve = resolver.dns_server_resolver(address, clock=clock)

    assert resolve("kept.test") == [ipaddress.ip_address("192.0.2.10")]
    server.records["kept.test"] = ["192.0.2.20"]
    clock.now += 29
    assert resolve("kept.test") == [ipaddress.ip_address("192.0.2.10")]
    assert server.queries["kept.test"] == 2  # one lookup: A and AAAA
    clock.now += 2
    assert resolve("kept.test") == [ipaddress.ip_address("192.0.2.20")]
    assert server.queries["kept.test"] == 4


def test_an_answer_with_ttl_zero_is_never_kept(dns_server, clock):
    server, address = dns_server
    answers = iter([["192.0.2.10"], ["192.0.2.11"], ["10.0.0.1"], ["192.0.2.12"]])
    server.records["rebind.test"] = lambda: next(answers)
    server.ttls["rebind.test"] = 0
    resolve = resolver.dns_server_resolver(address, clock=clock)

    assert resolve("rebind.test") == [ipaddress.ip_address("192.0.2.10")]
    assert resolve("rebind.test") == [ipaddress.ip_address("10.0.0.1")]


def test_a_long_ttl_is_kept_a_minute_at_most(dns_server, clock):
    server, address = dns_server
    server.records["long.test"] = ["192.0.2.10"]
    server.ttls["long.test"] = 86400
    resolve = resolver.dns_server_resolver(address, clock=clock)
    resolve("long.test")
    clock.now += resolver.ANSWER_KEPT_AT_MOST_S + 1
    resolve("long.test")
    assert server.queries["long.test"] == 4


def test_a_name_that_does_not_resolve_is_not_kept(dns_server, clock):
    server, address = dns_server
    resolve = resolver.dns_server_resolver(address, clock=clock)
    with pytest.raises(LookupError):
        resolve("nowhere.test")
    server.records["nowhere.test"] = ["192.0.2.30"]
    assert resolve("nowhere.test") == [ipaddress.ip_address("192.0.2.30")]
