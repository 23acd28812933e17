"""Reads of sandboxes and sessions, always for a given user."""

import uuid

from quor.lib.errors import NotFound
from sandboxes.models import ExecRecord, Sandbox, Session


def sessions_of(user):
    return Session.objects.filter(owner=user).select_related("model_provider")


def is_uuid(value) -> bool:
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True


def get_session_for_user(user, session_id) -> Session:
    """The user's own session; anyone else's, or a malformed id, is 404."""
    if not is_uuid(session_id):
        raise NotFound("No such session.")
    session = sessions_of(user).filter(pk=session_id).first()
    if session is None:
        raise NotFound("No such session.")
    return session


def get_sandbox_for_user(user):
    """The user's own sandbox; 404 when they have none yet."""
    sandbox = Sandbox.objects.filter(user=user).first()
    if sandbox is None:
        raise NotFound("You have no sandbox yet.")
    return sandbox


def events_after(session: Session, after: int, limit: int = 1000):
    return list(session.events.filter(seq__gt=after).order_by("seq")[:limit])


def get_exec_record(session: Session, exec_id) -> ExecRecord:
    """A run of the session's exec journal; another session's, or a malformed id, is 404."""
    record = session.exec_records.filter(pk=exec_id).first() if is_uuid(exec_id) else None
    if record is None:
        raise NotFound("No such command in this session's journal.")
    return record
