"""A new session's attachments are kept in the file store and copied into a real
sandbox; they can be copied again (a restored workspace), and a damaged one never is."""

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from quor import filestore
from quor.lib.errors import CorruptBlob
from sandboxes.runtime import services
from sandboxes.sessions import services as sessions

pytestmark = [pytest.mark.docker, pytest.mark.django_db]

CAT = ["cat", "attachments/numbers.txt"]


def new_session_with_numbers(owner, model_id):
    """Created, and its attachments copied as its first turn copies them."""
    session = sessions.session_create(
        user=owner,
        prompt="Add up the numbers in the attachment.",
        model=model_id,
        attachments=[SimpleUploadedFile("numbers.txt", b"10 20 30\n")],
    )
    sessions.session_attachments_copy(session=session)
    return session


def test_attachments_are_kept_in_the_file_store_and_copied_again_on_demand(
    running_sandbox, owner, model_id, queued, local_file_store
):
    session = new_session_with_numbers(owner, model_id)
    [attachment] = session.attachments.select_related("blob")
    copied = services.sandbox_exec(user=owner, session=session, argv=CAT).stdout
    services.sandbox_exec(user=owner, session=session, argv=["rm", "attachments/numbers.txt"])

    sessions.session_attachments_copy(session=session)

    assert filestore.blob_read(attachment.blob) == b"10 20 30\n"
    assert local_file_store.keys() == {attachment.blob.key}
    assert copied == services.sandbox_exec(user=owner, session=session, argv=CAT).stdout
    assert copied == b"10 20 30\n"


def test_a_damaged_attachment_is_refused_and_the_workspace_keeps_its_copy(
    running_sandbox, owner, model_id, queued, local_file_store
):
    session = new_session_with_numbers(owner, model_id)
    [attachment] = session.attachments.select_related("blob")
    local_file_store.write_raw(attachment.blob.key, b"10 20 99\n")

    with pytest.raises(CorruptBlob, match="is damaged: its SHA-256 is"):
        sessions.session_attachments_copy(session=session)

    assert services.sandbox_exec(user=owner, session=session, argv=CAT).stdout == b"10 20 30\n"
