"""Approvals acting on what happens to sessions below them (sandboxes/signals.py)."""

from approvals.models import ApprovalRequest
from approvals.services import approvals_expire_for_session
from quor.signals import user_deactivated
from sandboxes.models import Session
from sandboxes.signals import session_status_changed


def expire_approvals_of_cancelled_turn(sender, *, session: Session, status: str, **kwargs) -> None:
    """A cancelled turn's parked requests fail at once."""
    if status == Session.Status.CANCELLED:
        approvals_expire_for_session(session)


def fail_approvals_of_deactivated_user(sender, *, user, **kwargs) -> None:
    """A deactivated user decides nothing more: what their sessions' requests wait for
    fails closed at once, before their turns are cancelled."""
    waiting = Session.objects.filter(
        owner=user, approval_requests__status=ApprovalRequest.Status.PENDING
    ).distinct()
    for session in waiting:
        approvals_expire_for_session(session)


def connect() -> None:
    user_deactivated.connect(
        fail_approvals_of_deactivated_user, dispatch_uid="approvals-fail-on-deactivation"
    )
    session_status_changed.connect(
        expire_approvals_of_cancelled_turn, dispatch_uid="approvals-expire-on-cancel"
    )
