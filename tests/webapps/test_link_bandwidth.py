"""A visitor connection's share of its public link's bandwidth (webapps/link_bandwidth.py),
in-process: the connection and the shared count are stand-ins, the class is real."""

import asyncio
import functools
from types import SimpleNamespace

import pytest

from webapps import link_bandwidth


class Transport:
    def __init__(self):
        self.reading, self.closed = True, False

    def pause_reading(self):
        self.reading = False

    def resume_reading(self):
        self.reading = True

    def close(self):
        self.closed = True


class Connection:
    """What LinkBandwidth uses of a ViewerConnection."""

    def __init__(self):
        self.closed = False
        self.writing_paused = False
        self.sent: list[bytes] = []
        self.spent = None
        self.written = 0
        self.app = Transport()
        self.tasks = []
        self.proxy = SimpleNamespace(background=self.background)

    def background(self, work, failure):
        self.tasks.append(asyncio.ensure_future(work))

    def upstream(self):
        return self.app

    def send(self, data):
        self.sent.append(data)

    def bandwidth_written(self):
        self.written += 1

    def bandwidth_spent(self, error, *, sent):
        self.spent = (error, sent)


class Count:
    """The link's count in Redis: `left` bytes, each take answered when `answer` is set."""

    def __init__(self, left):
        self.left = left
        self.given_back = 0
        self.answer = asyncio.Event()
        self.answer.set()

    async def take(self, link, size, *, whole):
        await self.answer.wait()
        got = 0 if whole and size > self.left else min(size, self.left)
        self.left -= got
        return got

    async def give_back(self, link, size):
        self.given_back += size
        self.left += size


@pytest.fixture
def count(monkeypatch):
    def install(left):
        count = Count(left)
        monkeypatch.setattr(link_bandwidth.link_quotas, "bytes_take", count.take)
        monkeypatch.setattr(link_bandwidth.link_quotas, "bytes_give_back", count.give_back)
        return count

    return install


def in_a_loop(scenario):
    """The test, run to its end in an event loop of its own."""

    @functools.wraps(scenario)
    def test(*args, **kwargs):
        return asyncio.run(scenario(*args, **kwargs))

    return test


async def settle(connection):
    while connection.tasks:
        await connection.tasks.pop(0)


@in_a_loop
async def test_bytes_are_written_only_once_taken_and_in_order(count):
    counted, connection = count(10_000_000), Connection()
    bandwidth = link_bandwidth.LinkBandwidth(connection, link=None)
    assert not bandwidth.admit(b"head")
    assert not bandwidth.admit(b"body")  # behind the first, while it waits
    assert connection.app.reading is False
    await settle(connection)
    assert connection.sent == [b"head", b"body"]
    assert connection.app.reading is True and connection.written == 1
    assert bandwidth.admit(b"more")  # within what the grant left
    assert counted.left == 10_000_000 - link_bandwidth.LINK_GRANT_BYTES


@in_a_loop
async def test_a_response_of_known_length_that_does_not_fit_is_refused_before_its_first_byte(
    count,
):
    counted, connection = count(1000), Connection()
    bandwidth = link_bandwidth.LinkBandwidth(connection, link=None)
    bandwidth.expect(1001)
    assert not bandwidth.admit(b"x" * 100)
    await settle(connection)
    assert connection.sent == []
    assert connection.spent == (None, False)
    assert connection.app.closed  # never kept for another request, its bytes unread
    assert counted.left == 1000


@in_a_loop
async def test_an_unknown_length_is_cut_where_the_bandwidth_ends(count):
    counted, connection = count(150), Connection()
    bandwidth = link_bandwidth.LinkBandwidth(connection, link=None)
    for _ in range(3):
        bandwidth.admit(b"y" * 100)
    await settle(connection)
    assert connection.sent == [b"y" * 100]
    assert connection.spent == (None, True)  # a byte left: too late for a 429
    bandwidth.release()
    await settle(connection)
    assert counted.left == 50  # the 50 taken and never written went back


@in_a_loop
async def test_what_a_take_brings_after_the_visitor_left_goes_back_to_the_count(count):
    counted, connection = count(10_000_000), Connection()
    bandwidth = link_bandwidth.LinkBandwidth(connection, link=None)
    counted.answer.clear()
    bandwidth.admit(b"z" * 1000)
    await asyncio.sleep(0)  # the take is asked, and waits on the count
    connection.closed = True
    bandwidth.release()  # the connection was lost meanwhile
    counted.answer.set()
    await settle(connection)
    assert connection.sent == []
    assert counted.left == 10_000_000
    assert connection.app.closed
