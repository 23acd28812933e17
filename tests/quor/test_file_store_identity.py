"""The file store knows it is the database's: a process pointed at another directory or
bucket is refused before it writes, and what is missing there is not called damaged."""

import json

import pytest
from django.core.management import CommandError, call_command

from quor.filestore import MARKER_KEY, blob_put, blob_read, file_store_check
from quor.lib.errors import CorruptBlob, FileStoreMisconfigured, FileStoreUnavailable
from quor.models import FileStoreIdentity, StoredBlob
from sandboxes.models import Sandbox, Snapshot

pytestmark = pytest.mark.django_db


def test_the_first_write_marks_the_store_and_the_database_records_the_mark(file_store):
    blob_put(b"hello")
    identity = FileStoreIdentity.objects.get()
    assert json.loads(file_store.read_raw(MARKER_KEY))["id"] == identity.marker
    file_store_check()  # the same store: no complaint


def test_a_store_without_the_mark_is_refused_before_anything_is_written(
    local_file_store, another_file_store
):
    blob_put(b"in the workers' store")
    with another_file_store() as other:
        with pytest.raises(FileStoreMisconfigured) as refused:
            blob_put(b"would be lost")
        assert other.keys() == set()
    assert "has no Quor marker" in refused.value.message
    assert str(local_file_store.root) in refused.value.message  # where the right one is
    assert StoredBlob.objects.count() == 1


def test_a_store_marked_for_another_database_is_refused(local_file_store, another_file_store):
    blob_put(b"one")
    with another_file_store() as other:
        other.write_raw(MARKER_KEY, json.dumps({"id": "someone-else"}).encode())
        with pytest.raises(FileStoreMisconfigured) as refused:
            file_store_check()
    assert "belongs to another Quor database" in refused.value.message


def test_a_blob_missing_from_a_store_that_is_not_the_databases_is_not_called_damaged(
    local_file_store, another_file_store
):
    blob = blob_put(b"kept in the right store")
    with another_file_store(), pytest.raises(FileStoreMisconfigured):
        blob_read(blob)
    assert blob_read(blob) == b"kept in the right store"


def test_a_blob_missing_from_the_databases_own_store_is_damage(file_store):
    blob = blob_put(b"soon gone")
    file_store.delete_raw(blob.key)
    with pytest.raises(CorruptBlob, match="missing"):
        blob_read(blob)


def test_an_s3_store_out_of_reach_is_unavailable_not_damaged(s3_file_store, settings):
    blob = blob_put(b"in the bucket")
    options = settings.STORAGES["quor_files"]["OPTIONS"]
    closed = {**options, "endpoint_url": "http://127.0.0.1:9"}  # nothing listens there
    settings.STORAGES = {
        **settings.STORAGES,
        "quor_files": {**settings.STORAGES["quor_files"], "OPTIONS": closed},
    }
    with pytest.raises(FileStoreUnavailable, match="cannot be reached"):
        blob_read(blob)


def test_an_operator_command_from_a_checkout_with_another_store_refuses_to_run(
    local_file_store, another_file_store, owner
):
    blob_put(b"the workers have written here")
    sandbox = Sandbox.objects.create(user=owner, state=Sandbox.State.RUNNING, has_workspace=True)
    for command in (["sandbox_snapshot", owner.email], ["sandbox_destroy", owner.email]):
        with another_file_store(), pytest.raises(CommandError, match=r"filestore\.misconfigured"):
            call_command(*command)
    sandbox.refresh_from_db()
    assert sandbox.state == Sandbox.State.RUNNING
    assert not Snapshot.objects.exists()
    assert not sandbox.resets.exists()


def test_the_readiness_check_names_a_store_that_is_not_the_databases(
    client, local_file_store, another_file_store
):
    blob_put(b"x")
    with another_file_store():
        checks = client.get("/readyz").json()["checks"]
    assert checks["file_store"].startswith("error: FileStoreMisconfigured")


def test_a_database_without_a_record_never_adopts_a_store_lacking_its_files(
    local_file_store, another_file_store
):
    """Right after an upgrade, before any worker has checked: a blob missing from a wrong
    store must not make that store the database's (every file would then look damaged)."""
    blob = blob_put(b"in the workers' store")
    FileStoreIdentity.objects.all().delete()
    with another_file_store() as other:
        with pytest.raises(FileStoreMisconfigured, match="holds none of the database's"):
            blob_read(blob)
        assert not (other.root / MARKER_KEY).exists()
    assert not FileStoreIdentity.objects.exists()
    file_store_check()  # the right store, as a worker starting checks it: set up
    assert FileStoreIdentity.objects.get().marker
    assert blob_read(blob) == b"in the workers' store"


def test_an_unreadable_marker_is_a_misconfiguration(local_file_store):
    blob_put(b"x")
    local_file_store.write_raw(MARKER_KEY, b"not json")
    with pytest.raises(FileStoreMisconfigured, match="unreadable"):
        file_store_check()


def test_a_store_directory_that_vanished_is_not_written_beneath_its_mount_point(
    local_file_store,
):
    import shutil

    blob_put(b"first")
    shutil.rmtree(local_file_store.root)
    with pytest.raises(FileStoreMisconfigured):
        blob_put(b"second")
    assert not local_file_store.root.exists()
    local_file_store.root.mkdir()  # an unmounted share leaves its empty mount point
    with pytest.raises(FileStoreMisconfigured):
        blob_put(b"third")
    assert list(local_file_store.root.iterdir()) == []


def test_the_orphan_sweep_never_runs_in_a_store_that_is_not_the_databases(
    local_file_store, another_file_store
):
    from quor.filestore import blobs_delete_orphans

    blob_put(b"the database's")
    with another_file_store() as other:
        other.write_raw("blobs/ab/abcdef", b"someone else's file", hours_old=3)
        with pytest.raises(FileStoreMisconfigured):
            blobs_delete_orphans()
        assert other.keys() == {"blobs/ab/abcdef"}
