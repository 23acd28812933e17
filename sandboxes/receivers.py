"""Deleting a Library file, a Skill or a session's attachment deletes its blob, whichever
path deleted it (a service, the admin, a cascade from a user or an organization)."""

from django.db.models.signals import post_delete

from quor.filestore import blob_delete
from quor.models import StoredBlob
from sandboxes.models import Attachment, LibraryFile, Skill

BLOB_FIELDS = {LibraryFile: "blob_id", Skill: "bundle_id", Attachment: "blob_id"}


def delete_the_blob(sender, instance, **kwargs) -> None:
    blob = StoredBlob.objects.filter(pk=getattr(instance, BLOB_FIELDS[sender])).first()
    if blob is not None:
        blob_delete(blob)


def connect() -> None:
    for model in BLOB_FIELDS:
        post_delete.connect(delete_the_blob, sender=model, dispatch_uid=f"blob-{model.__name__}")
