"""Parking a request until the session owner decides, for the proxy plugin.

Under `--threaded` a parked request holds only its own connection's thread, waiting
on an event; the database work (recording the request, settling it) runs on a small
pool of threads, so request threads still never open a database connection."""

import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

from django.db import close_old_connections

from approvals import services, wakeup
from approvals.models import ApprovalRequest

GRANTED = "granted"  # a session grant already covered it
UNAVAILABLE = "unavailable"  # approvals cannot work right now: fail closed
CLIENT_GONE = "client_gone"  # the sandbox closed the connection: nothing to forward
DATABASE_TIMEOUT = 30
CLIENT_CHECK_SECONDS = 0.5
# The listener subscribes when an acceptor takes its first connection and retries a
# lost Redis every second: a request waits this long for it before failing closed.
SUBSCRIBE_WAIT_SECONDS = 4


def _with_fresh_connection(function, *args, **kwargs):
    close_old_connections()
    try:
        return function(*args, **kwargs)
    finally:
        close_old_connections()


class ApprovalDesk:
    def __init__(self, listener: wakeup.DecisionListener | None = None, workers: int = 4):
        self.listener = listener or wakeup.DecisionListener()
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="egress-approvals-db")

    def start(self) -> None:
        self.listener.start()

    def stop(self) -> None:
        self.listener.stop()
        self._pool.shutdown(wait=True)

    def park_and_wait(self, *, client_gone=lambda: False, **request) -> str:
        """Records the request, waits for the decision, returns the final status:
        approved, rejected, expired, GRANTED, UNAVAILABLE or CLIENT_GONE.

        `client_gone` is asked twice a second while waiting, and once more after an
        approval: a client that gave up (and may retry) must not get its request sent
        behind its back."""
        if not self.listener.wait_until_subscribed(SUBSCRIBE_WAIT_SECONDS):
            return UNAVAILABLE
        approval_id = uuid.uuid4()
        self.listener.expect(str(approval_id))
        try:
            approval = self._pool.submit(
                _with_fresh_connection,
                services.park_request_for_approval,
                approval_id=approval_id,
                **request,
            ).result(DATABASE_TIMEOUT)
        except Exception:
            self.listener.forget(str(approval_id))
            return UNAVAILABLE
        if approval is None:
            self.listener.forget(str(approval_id))
            return GRANTED
        try:
            status = self._wait(str(approval_id), approval.expires_at, client_gone)
        finally:
            self.listener.forget(str(approval_id))
        if status not in (ApprovalRequest.Status.APPROVED, ApprovalRequest.Status.REJECTED):
            try:  # no word, lost Redis, client gone: PostgreSQL decides, expiring it if open
                status = self._pool.submit(
                    _with_fresh_connection, services.approval_settle, approval_id
                ).result(DATABASE_TIMEOUT)
            except Exception:
                return UNAVAILABLE
        if status == ApprovalRequest.Status.APPROVED and client_gone():
            return CLIENT_GONE
        return status

    def _wait(self, approval_id: str, expires_at, client_gone) -> str | None:
        while (remaining := (expires_at - datetime.now(UTC)).total_seconds()) > 0:
            status = self.listener.wait(approval_id, min(remaining, CLIENT_CHECK_SECONDS))
            if status is not None or client_gone():
                return status
        return None
