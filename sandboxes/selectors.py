"""Reads of sandboxes, sessions and what they hold, and of Skills: for a given user, or
sandbox (the operator API's: of every organization)."""

import uuid

from django.db.models import Max

from quor.lib.errors import NotFound
from sandboxes.models import ExecRecord, Sandbox, Session, Skill


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


def sandbox_of(user) -> Sandbox | None:
    """The user's own sandbox, None when they have none yet."""
    return Sandbox.objects.filter(user=user).first()


def get_sandbox_for_user(user):
    """The user's own sandbox; 404 when they have none yet."""
    sandbox = sandbox_of(user)
    if sandbox is None:
        raise NotFound("You have no sandbox yet.")
    return sandbox


def sandboxes_for_operator(*, organization: str = "", state: str = ""):
    """Every organization's sandboxes (the operator API), of one organization (a slug)
    or in one state where given."""
    sandboxes = Sandbox.objects.select_related("user__membership__organization")
    if organization:
        sandboxes = sandboxes.filter(user__membership__organization__slug=organization)
    if state:
        sandboxes = sandboxes.filter(state=state)
    return sandboxes


def get_sandbox_for_operator(sandbox_id) -> Sandbox:
    """Any organization's sandbox; an unknown or malformed id is 404."""
    sandbox = (
        sandboxes_for_operator().filter(pk=sandbox_id).first() if is_uuid(sandbox_id) else None
    )
    if sandbox is None:
        raise NotFound("No such sandbox.", code="sandboxes.not_found")
    return sandbox


def events_after(session: Session, after: int, limit: int = 1000):
    return list(session.events.filter(seq__gt=after).order_by("seq")[:limit])


def get_exec_record(session: Session, exec_id) -> ExecRecord:
    """A run of the session's exec journal; another session's, or a malformed id, is 404."""
    record = session.exec_records.filter(pk=exec_id).first() if is_uuid(exec_id) else None
    if record is None:
        raise NotFound("No such command in this session's journal.")
    return record


def exec_records_of(session: Session):
    """The session's exec journal."""
    return session.exec_records.all()


def session_of_sandbox(sandbox: Sandbox, session_id) -> Session | None:
    """One of the sandbox's own sessions; None for another's, or a malformed id."""
    return sandbox.sessions.filter(pk=session_id).first() if is_uuid(session_id) else None


def workspace_reset_after(session: Session):
    """The first reset of the session's sandbox's workspace since the session began, or
    None."""
    return (
        session.sandbox.resets.filter(created_at__gt=session.created_at)
        .order_by("created_at")
        .first()
    )


def last_event_seq(session: Session) -> int:
    """The seq of the session's newest event (0: none yet)."""
    return session.events.aggregate(last=Max("seq"))["last"] or 0


def session_apps(session: Session):
    """The Apps the session may use, by name."""
    return session.apps.order_by("name")


def skills_of(organization):
    """The organization's Skills (an Organization or its id)."""
    return Skill.objects.filter(organization=organization)


def library_files_of(user):
    """The user's library files, with their blobs."""
    return user.library_files.select_related("blob")
