"""The sandboxes app's receivers: blobs deleted with their rows, and the Library,
Skills, scheduling and the terminal acting on the notifications of the layers below them
(sandboxes/signals.py)."""

from django.db import transaction
from django.db.models.signals import post_delete

from quor.filestore import blob_delete
from quor.lib.tasks import send_on_commit
from quor.models import StoredBlob
from quor.signals import user_deactivated
from sandboxes.library.managed import sync_managed_area_after_wake
from sandboxes.models import Attachment, LibraryFile, Session, Skill, TerminalRecording
from sandboxes.scheduling.services import settle_scheduled_run
from sandboxes.sessions.events import viewers_disconnect
from sandboxes.signals import runtime_ready, session_status_changed
from sandboxes.terminal.services import ENDED_BY_CANCEL, terminal_end

BLOB_FIELDS = {
    LibraryFile: "blob_id",
    Skill: "bundle_id",
    Attachment: "blob_id",
    TerminalRecording: "cast_id",
}


def delete_the_blob(sender, instance, **kwargs) -> None:
    """Whichever path deleted the row: a service, the admin, a cascade from a user or an
    organization."""
    blob = StoredBlob.objects.filter(pk=getattr(instance, BLOB_FIELDS[sender])).first()
    if blob is not None:
        blob_delete(blob)


def end_deactivated_users_work(sender, *, user, **kwargs) -> None:
    """Once the deactivation commits: the user's open event streams close, and a task
    cancels their turns and puts their sandbox to sleep (the backend takes its time)."""
    transaction.on_commit(lambda: viewers_disconnect(user.pk), robust=True)
    send_on_commit("sandboxes.tasks.end_deactivated_users_work", str(user.pk))


def end_the_terminal_of_a_cancelled_turn(sender, *, session, status, **kwargs) -> None:
    """A cancel of the session's turn ends its terminal too, once the cancel commits (a
    session whose terminal is not recording has no shell to end)."""
    if status != Session.Status.CANCELLED:
        return
    if TerminalRecording.objects.filter(
        session=session, status=TerminalRecording.Status.RECORDING
    ).exists():
        transaction.on_commit(
            lambda: terminal_end(session_id=session.pk, reason=ENDED_BY_CANCEL), robust=True
        )


def connect() -> None:
    for model in BLOB_FIELDS:
        post_delete.connect(delete_the_blob, sender=model, dispatch_uid=f"blob-{model.__name__}")
    runtime_ready.connect(sync_managed_area_after_wake, dispatch_uid="library-after-wake")
    session_status_changed.connect(settle_scheduled_run, dispatch_uid="scheduled-run-settle")
    session_status_changed.connect(
        end_the_terminal_of_a_cancelled_turn, dispatch_uid="terminal-end-on-cancel"
    )
    user_deactivated.connect(end_deactivated_users_work, dispatch_uid="sandboxes-deactivation")
