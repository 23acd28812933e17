"""Reads of terminal recordings, each with who may read it: the session's owner, and the
organization's auditors (AUDIT_VIEW). Anyone else's, or one not ended yet, is 404."""

from quor.lib.errors import NotFound
from quor.lib.permissions import get_active_membership
from sandboxes.models import TerminalRecording
from sandboxes.selectors import get_session_for_user, is_uuid


def _ended(recordings, recording_id) -> TerminalRecording:
    recording = (
        recordings.filter(pk=recording_id, status=TerminalRecording.Status.ENDED)
        .select_related("cast")
        .first()
        if is_uuid(recording_id)
        else None
    )
    if recording is None:
        raise NotFound("No such terminal recording.")
    return recording


def get_recording_for_owner(user, session_id, recording_id) -> TerminalRecording:
    session = get_session_for_user(user, session_id)
    return _ended(session.terminal_recordings, recording_id)


def get_recording_for_auditor(user, recording_id) -> TerminalRecording:
    """The caller holds AUDIT_VIEW (the view's declaration): any of their organization's."""
    organization = get_active_membership(user).organization
    return _ended(TerminalRecording.objects.filter(organization=organization), recording_id)


def session_recordings(session) -> list[TerminalRecording]:
    """The session's ended recordings, newest first, for its page."""
    return list(
        session.terminal_recordings.filter(status=TerminalRecording.Status.ENDED).order_by(
            "-started_at"
        )[:50]
    )
