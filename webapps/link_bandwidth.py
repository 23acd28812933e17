"""A public link visitor's connection takes the link's bandwidth before it writes: from
the count every proxy process shares (webapps/link_quotas.py), so that parallel
requests, in one process or many, never serve more than the link may. A response of
known length takes all its bytes at once, or none (the visitor gets 429 before its
first byte); one of unknown length takes LINK_GRANT_BYTES at a time and is cut where
the bandwidth ends. Bytes taken and not written go back to the count."""

import logging

from webapps import link_quotas

logger = logging.getLogger(__name__)

# A connection takes this much of its link's bandwidth at a time, or a response's whole
# length when it is known.
LINK_GRANT_BYTES = 256 * 1024


class LinkBandwidth:
    """One visitor request's (or WebSocket's) share of its link's bandwidth, for the
    connection (webapps/proxy.py ViewerConnection) that writes its response: it asks
    `admit` before each write, and bytes not admitted are sent from here once taken."""

    def __init__(self, connection, link):
        self.connection = connection
        self.link = link
        self.granted = 0  # taken and not written yet
        self.waiting: list[bytes] = []  # written while more was being taken
        self.whole = 0  # a response's known length: taken all at once, or refused
        self.paused = None  # the transport not read while `waiting` waits
        self.sent = False  # a byte of the response left: too late for a 429
        self.released = False

    def admit(self, data: bytes) -> bool:
        """True if `data` may be written now (it is counted); else it waits, in order,
        the app unread meanwhile, and is sent from here once taken."""
        if not self.waiting and not self.whole and len(data) <= self.granted:
            self.granted -= len(data)
            self.sent = True
            return True
        self.waiting.append(data)
        if len(self.waiting) == 1:
            self.paused = self.connection.upstream()
            if self.paused is not None:
                self.paused.pause_reading()
            self.connection.proxy.background(
                self._take(), "could not take a public link's bandwidth"
            )
        return False

    def expect(self, total: int) -> None:
        """A response of known length (head and body): taken whole before its head is
        written, so that one that does not fit gets 429, not half a body."""
        if total > self.granted:
            self.whole = total - self.granted

    async def _take(self) -> None:
        connection, error = self.connection, None
        while self.waiting and not connection.closed:
            want = sum(map(len, self.waiting)) - self.granted
            whole, self.whole = self.whole, 0
            try:
                if whole:
                    got = await link_quotas.bytes_take(self.link, max(whole, want), whole=True)
                else:
                    size = max(want, LINK_GRANT_BYTES)
                    got = await link_quotas.bytes_take(self.link, size, whole=False)
            except Exception as failure:  # Redis: a quota it cannot count is not one
                got, error = 0, failure
            self.granted += got
            if connection.closed or self.released:  # nothing more is written
                self.release()
                return self.close_unread()
            while self.waiting and len(self.waiting[0]) <= self.granted:
                data = self.waiting.pop(0)
                self.granted -= len(data)
                self.sent = True
                connection.send(data)
            if self.waiting and not got:
                self.waiting = []
                self.close_unread()
                if error is not None:
                    logger.warning("web app proxy: cannot count a public link's bytes (%s)", error)
                else:
                    logger.info("web app proxy: a public link's bandwidth is used up")
                return connection.bandwidth_spent(error, sent=self.sent)
        # The app's connection, even if its response ended meanwhile (kept for another);
        # while the viewer's socket is full, its resume_writing resumes the current one.
        paused, self.paused = self.paused, None
        if paused is not None and not (
            connection.writing_paused and paused is connection.upstream()
        ):
            paused.resume_reading()
        connection.bandwidth_written()

    def close_unread(self) -> None:
        """The app's connection whose bytes were not all written is closed, never kept
        for another request (unread, it would hang that one)."""
        paused, self.paused = self.paused, None
        if paused is not None:
            paused.close()

    def release(self) -> None:
        """The bytes taken and not written go back to the link's count; once, and
        again for what a take still under way brings after."""
        self.released, self.whole = True, 0
        granted, self.granted = self.granted, 0
        if granted:
            self.connection.proxy.background(
                link_quotas.bytes_give_back(self.link, granted),
                "could not give back a public link's bytes",
            )
