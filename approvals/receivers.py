"""Approvals acting on what happens to sessions below them (sandboxes/signals.py)."""

from approvals.services import approvals_expire_for_session
from sandboxes.models import Session
from sandboxes.signals import session_status_changed


def expire_approvals_of_cancelled_turn(sender, *, session: Session, status: str, **kwargs) -> None:
    """A cancelled turn's parked requests fail at once."""
    if status == Session.Status.CANCELLED:
        approvals_expire_for_session(session)


def connect() -> None:
    session_status_changed.connect(
        expire_approvals_of_cancelled_turn, dispatch_uid="approvals-expire-on-cancel"
    )
