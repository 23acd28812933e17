"""Directory and S3 sources: syncs that add, change and delete documents, read nothing
they need not and nothing outside what the operator allowed, and delete nothing after a
listing that failed. Real directories, a real S3 server (moto_server), real PostgreSQL."""

import os
import threading
import uuid
from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from knowledge import services, sync
from knowledge.models import KnowledgeDocument, KnowledgeSource
from knowledge.principals import principal
from knowledge.search import search_for_user
from quor.lib.errors import InvalidInput
from quor.models import Membership
from tests import factories

DIRECTORY = KnowledgeSource.Kind.DIRECTORY
S3 = KnowledgeSource.Kind.S3


@dataclass
class People:
    acme: object
    admin: object
    reader: object
    colleague: object
    globex: object
    globex_admin: object
    stranger: object


@pytest.fixture
def people(db):
    acme = factories.make_org(name="Acme", slug="acme")
    globex = factories.make_org(name="Globex", slug="globex")
    return People(
        acme=acme,
        admin=factories.make_user(acme, role=Membership.Role.ADMIN, email="admin@acme.test"),
        reader=factories.make_user(acme, email="reader@acme.test"),
        colleague=factories.make_user(acme, email="colleague@acme.test"),
        globex=globex,
        globex_admin=factories.make_user(
            globex, role=Membership.Role.ADMIN, email="admin@globex.test"
        ),
        stranger=factories.make_user(globex, email="stranger@globex.test"),
    )


@pytest.fixture
def sent(monkeypatch):
    """The tasks sent (no broker): (task name, arguments)."""
    from quor.lib import tasks

    calls = []
    monkeypatch.setattr(tasks, "send", lambda name, *args: calls.append((name, args)))
    return calls


@pytest.fixture
def allowed(tmp_path, settings):
    """The one directory the operator allows; sources read folders inside it."""
    root = tmp_path / "allowed"
    root.mkdir()
    settings.QUOR_KNOWLEDGE_DIRECTORY_ROOTS = [str(root)]
    return root


@pytest.fixture
def folder(allowed):
    path = allowed / "handbook"
    path.mkdir()
    return path


def write(path, data: bytes, *, mtime: float | None = None):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if mtime is not None:
        os.utime(path, (mtime, mtime))


def directory_source(people, folder, **fields):
    return services.source_create(
        organization=people.acme, name="Handbook", kind=DIRECTORY, location=str(folder), **fields
    )


def documents(source) -> dict[str, bytes]:
    """The source's documents by name, with their stored content."""
    from quor.filestore import blob_read

    return {
        document.external_id: blob_read(document.blob)
        for document in KnowledgeDocument.objects.filter(source=source).select_related("blob")
    }


def synced(source) -> KnowledgeSource:
    result = sync.source_sync(source.pk)
    assert result is not None
    return result


# --- a directory ----------------------------------------------------------------------


def test_a_directory_sync_adds_changes_and_deletes_documents(people, folder):
    write(folder / "travel.txt", b"Travel by train.", mtime=1_700_000_000)
    write(folder / "policies" / "security.md", b"# Security\n\nLock your screen.")
    source = directory_source(people, folder)
    assert source.sync_state == KnowledgeSource.SyncState.IDLE and source.synced_at is None

    source = synced(source)
    assert documents(source) == {
        "travel.txt": b"Travel by train.",
        "policies/security.md": b"# Security\n\nLock your screen.",
    }
    assert (source.sync_state, source.sync_error) == (KnowledgeSource.SyncState.IDLE, "")
    first_synced_at = source.synced_at
    assert first_synced_at is not None

    write(folder / "travel.txt", b"Travel by train or by bus.", mtime=1_700_000_100)
    (folder / "policies" / "security.md").unlink()
    write(folder / "lunch.txt", b"Lunch at noon.")
    source = synced(source)

    assert documents(source) == {
        "travel.txt": b"Travel by train or by bus.",
        "lunch.txt": b"Lunch at noon.",
    }
    travel = source.documents.get(external_id="travel.txt")
    assert travel.state == KnowledgeDocument.State.PENDING  # its new content is indexed next
    assert travel.source_updated_at.timestamp() == 1_700_000_100
    assert source.synced_at > first_synced_at


def test_an_unchanged_file_is_not_read_again(people, folder, monkeypatch):
    write(folder / "travel.txt", b"Travel by train.", mtime=1_700_000_000)
    write(folder / "lunch.txt", b"Lunch at noon.", mtime=1_700_000_000)
    source = synced(directory_source(people, folder))
    read = []
    read_file = sync._read_file
    monkeypatch.setattr(
        sync, "_read_file", lambda fd, name, limit: read.append(name) or read_file(fd, name, limit)
    )

    synced(source)
    assert read == []

    # Same content, newer time: read once, and then known by its time again.
    os.utime(folder / "lunch.txt", (1_700_000_500, 1_700_000_500))
    synced(source)
    synced(source)
    assert read == ["lunch.txt"]
    assert source.documents.get(external_id="lunch.txt").source_updated_at.timestamp() == (
        1_700_000_500
    )


def test_a_link_out_of_the_directory_is_never_read(people, folder, tmp_path):
    secret = tmp_path / "secret"
    secret.mkdir()
    write(secret / "passwords.txt", b"root password hunter2")
    (folder / "passwords.txt").symlink_to(secret / "passwords.txt")
    (folder / "more").symlink_to(secret)
    write(folder / "travel.txt", b"Travel by train.")

    source = synced(directory_source(people, folder))

    assert list(documents(source)) == ["travel.txt"]
    assert "passwords.txt: A link, not followed." in source.sync_error
    assert "more: A link, not followed." in source.sync_error


def test_a_file_swapped_for_a_link_after_the_listing_is_not_read(
    people, folder, tmp_path, monkeypatch
):
    write(tmp_path / "secret.txt", b"root password hunter2")
    write(folder / "travel.txt", b"Travel by train.")
    listing = sync._directory_entries

    def swap_while_listing(root, location):
        for entry in listing(root, location):
            (folder / "travel.txt").unlink()
            (folder / "travel.txt").symlink_to(tmp_path / "secret.txt")
            yield entry

    monkeypatch.setattr(sync, "_directory_entries", swap_while_listing)
    source = synced(directory_source(people, folder))

    assert documents(source) == {}
    assert "travel.txt: It cannot be read" in source.sync_error


def test_a_directory_swapped_for_a_link_after_the_check_does_not_lead_the_listing_out(
    people, allowed, tmp_path, monkeypatch
):
    inner = allowed / "team" / "handbook"
    write(inner / "travel.txt", b"Travel by train.")
    source = directory_source(people, inner)
    outside = tmp_path / "outside"
    write(outside / "handbook" / "secret.txt", b"The payroll.")
    (allowed / "team" / "handbook" / "travel.txt").unlink()
    (allowed / "team" / "handbook").rmdir()
    (allowed / "team").rmdir()
    (allowed / "team").symlink_to(outside)
    # The location was checked before the swap (as a sync that was already past it).
    monkeypatch.setattr(
        sync.locations, "directory_location", lambda organization, location: str(inner)
    )

    source = synced(source)
    assert source.sync_state == KnowledgeSource.SyncState.FAILED
    assert documents(source) == {}


def test_names_are_kept_as_listed_so_a_file_with_spaces_stays_one_document(people, folder):
    write(folder / " notes.txt ", b"Notes with spaces around the name.")
    source = synced(directory_source(people, folder))
    first = source.documents.get()
    for _ in range(2):
        source = synced(source)
        assert list(source.documents.values_list("pk", "external_id")) == [
            (first.pk, " notes.txt ")
        ]


def test_a_linked_folder_whose_name_is_not_utf8_is_named_and_the_sync_ends(
    people, folder, tmp_path
):
    write(folder / "travel.txt", b"Travel by train.")
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", os.path.join(os.fsencode(folder), b"caf\xe9"))
    source = synced(directory_source(people, folder))
    assert source.sync_state == KnowledgeSource.SyncState.IDLE
    assert "caf\\xe9" in source.sync_error and "not UTF-8" in source.sync_error
    assert set(documents(source)) == {"travel.txt"}


def test_a_fifo_is_skipped_without_waiting_on_it(people, folder):
    os.mkfifo(folder / "pipe.txt")
    write(folder / "travel.txt", b"Travel by train.")

    source = synced(directory_source(people, folder))

    assert list(documents(source)) == ["travel.txt"]
    assert "pipe.txt: Not a regular file." in source.sync_error


def test_files_too_large_or_of_an_unsupported_type_are_named_and_the_others_index(
    people, folder, settings
):
    settings.QUOR_KNOWLEDGE_MAX_FILE_BYTES = 100
    write(folder / "big.txt", b"word " * 100)
    write(folder / "program.bin", b"\x7fELF\x02\x01\x01\x00\x00\x00\x00")
    write(folder / "empty.txt", b"")
    write(folder / "travel.txt", b"Travel by train.")

    source = synced(directory_source(people, folder))

    assert list(documents(source)) == ["travel.txt"]
    assert source.sync_state == KnowledgeSource.SyncState.IDLE
    assert source.sync_error.splitlines() == [
        "3 files were not indexed:",
        "big.txt: The file is larger than 100 bytes.",
        "empty.txt: The file is empty.",
        "program.bin: This is a binary file, not a document Quor can read.",
    ]


def test_a_missing_directory_fails_the_sync_and_deletes_nothing(people, folder, allowed):
    write(folder / "travel.txt", b"Travel by train.")
    source = synced(directory_source(people, folder))
    synced_at = source.synced_at
    folder.rename(allowed / "moved")

    source = synced(source)

    assert source.sync_state == KnowledgeSource.SyncState.FAILED
    assert source.sync_error == (
        f"The directory {os.path.realpath(folder)} cannot be listed: No such file or directory."
    )
    assert source.synced_at == synced_at
    assert list(documents(source)) == ["travel.txt"]


def test_an_empty_mount_point_fails_the_sync_and_deletes_nothing(people, folder):
    write(folder / "travel.txt", b"Travel by train.")
    write(folder / "lunch.txt", b"Lunch at noon.")
    source = synced(directory_source(people, folder))
    for path in folder.iterdir():  # the share is unmounted: its mount point is empty
        path.unlink()

    source = synced(source)

    assert source.sync_state == KnowledgeSource.SyncState.FAILED
    assert source.sync_error.startswith(
        f"{os.path.realpath(folder)} holds no files any more, so its 2 documents are kept"
    )
    assert sorted(documents(source)) == ["lunch.txt", "travel.txt"]


def test_a_directory_no_longer_allowed_fails_the_sync_and_deletes_nothing(
    people, folder, settings, tmp_path
):
    write(folder / "travel.txt", b"Travel by train.")
    source = synced(directory_source(people, folder))
    settings.QUOR_KNOWLEDGE_DIRECTORY_ROOTS = [str(tmp_path / "elsewhere")]

    source = synced(source)

    assert source.sync_state == KnowledgeSource.SyncState.FAILED
    assert "is not inside an allowed directory" in source.sync_error
    assert list(documents(source)) == ["travel.txt"]


@pytest.mark.parametrize(
    "location",
    [
        "/etc",
        "/",
        "{allowed}/../outside",
        "{allowed}-evil/docs",
        "{allowed}/link-out",
        "relative/handbook",
        "",
    ],
)
def test_a_directory_outside_the_allowed_roots_is_refused_at_creation(
    people, allowed, tmp_path, client_for, location
):
    (allowed / "link-out").symlink_to(tmp_path)
    response = client_for(people.admin).post(
        "/api/v1/knowledge/sources/",
        {"name": "Server", "kind": "directory", "location": location.format(allowed=allowed)},
        format="json",
    )
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "knowledge.invalid_source"
    assert f"A directory source reads inside {allowed} only." in error["message"]
    assert not KnowledgeSource.objects.filter(name="Server").exists()


def test_a_path_outside_gets_the_same_answer_whether_it_exists_or_not(people, allowed):
    messages = []
    for location in ("/etc", "/no-such-directory-anywhere"):
        with pytest.raises(InvalidInput) as refused:
            directory_source(people, location)
        messages.append(refused.value.message.replace(location, "<path>"))
    assert messages[0] == messages[1]


def test_without_allowed_roots_directory_sources_are_refused(people, settings, tmp_path):
    settings.QUOR_KNOWLEDGE_DIRECTORY_ROOTS = []
    with pytest.raises(InvalidInput, match="Directory sources are not enabled"):
        directory_source(people, tmp_path)


def test_a_root_given_to_one_organization_is_refused_to_another(
    people, settings, tmp_path, client_for
):
    acme_root, shared = tmp_path / "acme", tmp_path / "shared"
    acme_root.mkdir()
    shared.mkdir()
    settings.QUOR_KNOWLEDGE_DIRECTORY_ROOTS = [f"acme:{acme_root}", str(shared)]

    def create(admin, location):
        return client_for(admin).post(
            "/api/v1/knowledge/sources/",
            {"name": "Docs", "kind": "directory", "location": str(location)},
            format="json",
        )

    refused = create(people.globex_admin, acme_root)
    assert refused.status_code == 400
    assert refused.json()["error"]["message"].endswith(
        f"A directory source reads inside {shared} only."
    )
    assert create(people.globex_admin, shared).status_code == 201
    assert create(people.admin, acme_root).status_code == 201


def test_a_sync_running_elsewhere_is_left_alone_and_a_silent_one_is_taken_over(people, folder):
    write(folder / "travel.txt", b"Travel by train.")
    source = directory_source(people, folder)
    running = KnowledgeSource.objects.filter(pk=source.pk)
    running.update(sync_state=KnowledgeSource.SyncState.SYNCING, sync_heartbeat_at=timezone.now())

    assert sync.source_sync(source.pk) is None
    assert documents(source) == {}

    running.update(sync_heartbeat_at=timezone.now() - sync.SILENT_AFTER - timedelta(seconds=1))
    assert synced(source).sync_state == KnowledgeSource.SyncState.IDLE
    assert list(documents(source)) == ["travel.txt"]


def test_a_sync_taken_over_stops_without_deleting_or_ending_the_others(people, folder, monkeypatch):
    write(folder / "a.txt", b"First file.")
    write(folder / "b.txt", b"Second file.")
    source = synced(directory_source(people, folder))
    (folder / "a.txt").unlink()
    write(folder / "b.txt", b"Second file, changed.", mtime=1_700_000_000)
    write(folder / "c.txt", b"Third file.")
    monkeypatch.setattr(sync, "HEARTBEAT_EVERY", timedelta(0))
    put = services.document_put_content
    other_heartbeat = timezone.now() + timedelta(seconds=1)

    def put_then_lose_the_source(**fields):
        KnowledgeSource.objects.filter(pk=source.pk).update(sync_heartbeat_at=other_heartbeat)
        return put(**fields)

    monkeypatch.setattr(services, "document_put_content", put_then_lose_the_source)

    assert sync.source_sync(source.pk) is None
    source.refresh_from_db()
    assert source.sync_state == KnowledgeSource.SyncState.SYNCING
    assert source.sync_heartbeat_at == other_heartbeat
    assert "a.txt" in documents(source)  # only a sync that holds the source deletes


@pytest.mark.django_db(transaction=True)
def test_two_syncs_at_once_run_once_and_add_each_file_once(people, folder, sent, monkeypatch):
    for name in ("a.txt", "b.txt", "c.txt"):
        write(folder / name, f"The file {name}.".encode())
    source = directory_source(people, folder)
    beside = []

    def sync_in_another_thread():
        try:
            beside.append(sync.source_sync(source.pk))
        finally:
            connection.close()

    put = services.document_put_content

    def put_while_another_sync_starts(**fields):
        if not beside:
            thread = threading.Thread(target=sync_in_another_thread)
            thread.start()
            thread.join()
        return put(**fields)

    monkeypatch.setattr(services, "document_put_content", put_while_another_sync_starts)

    assert synced(source).sync_state == KnowledgeSource.SyncState.IDLE
    assert beside == [None]
    assert sorted(
        KnowledgeDocument.objects.filter(source=source).values_list("external_id", flat=True)
    ) == ["a.txt", "b.txt", "c.txt"]
    indexing = [args for name, args in sent if name == "knowledge.tasks.index_document"]
    assert len(indexing) == 3


def test_synced_documents_get_the_default_access_and_only_permitted_users_find_them(people, folder):
    write(folder / "travel.txt", b"Travel policy: take the quokkatrain.")
    source = directory_source(people, folder, default_access=[principal("user", people.reader.pk)])
    source = synced(source)
    document = source.documents.get()
    assert document.access == [principal("user", people.reader.pk)]
    assert services.document_index(document.pk) is not None

    def titles(user):
        return [result.title for result in search_for_user(user, "quokkatrain")]

    assert titles(people.reader) == ["travel"]
    assert titles(people.colleague) == []
    assert titles(people.stranger) == []


# --- an S3 prefix ------------------------------------------------------------------------


@dataclass
class Bucket:
    client: object
    name: str

    def put(self, key: str, data: bytes):
        self.client.put_object(Bucket=self.name, Key=key, Body=data)

    def delete(self, key: str):
        self.client.delete_object(Bucket=self.name, Key=key)


@pytest.fixture
def bucket(s3_file_store, settings):
    """A bucket of documents on the file store's S3 server; `<bucket>/team` is allowed."""
    name = f"quor-docs-{uuid.uuid4().hex[:12]}"
    s3_file_store.client.create_bucket(Bucket=name)
    settings.QUOR_KNOWLEDGE_S3_PREFIXES = [f"{name}/team"]
    return Bucket(s3_file_store.client, name)


def s3_source(people, location):
    return services.source_create(organization=people.acme, name="Team", kind=S3, location=location)


def test_an_s3_sync_follows_added_changed_and_deleted_keys_inside_its_prefix(people, bucket):
    bucket.put("team/travel.txt", b"Travel by train.")
    bucket.put("team/policies/security.md", b"# Security")
    bucket.put("team/policies/", b"")  # a folder marker
    bucket.put("team2/salaries.txt", b"Not the team's.")
    bucket.put("teamwork.txt", b"Not the team's either.")
    source = synced(s3_source(people, f"{bucket.name}/team/"))
    assert source.location == f"{bucket.name}/team"
    assert documents(source) == {
        "travel.txt": b"Travel by train.",
        "policies/security.md": b"# Security",
    }
    assert (source.sync_state, source.sync_error) == (KnowledgeSource.SyncState.IDLE, "")

    bucket.put("team/travel.txt", b"Travel by train or by bus.")
    bucket.delete("team/policies/security.md")
    bucket.put("team/lunch.txt", b"Lunch at noon.")
    source = synced(source)

    assert documents(source) == {
        "travel.txt": b"Travel by train or by bus.",
        "lunch.txt": b"Lunch at noon.",
    }


@pytest.mark.parametrize(
    "location", ["{bucket}/team2", "{bucket}", "{bucket}/team/../team2", "other-bucket/team", ""]
)
def test_an_s3_location_outside_the_allowed_prefixes_is_refused(people, bucket, location):
    with pytest.raises(InvalidInput, match=f"reads inside {bucket.name}/team only"):
        s3_source(people, location.format(bucket=bucket.name))


def test_an_unreachable_s3_server_fails_the_sync_and_deletes_nothing(people, bucket, settings):
    bucket.put("team/travel.txt", b"Travel by train.")
    source = synced(s3_source(people, f"{bucket.name}/team"))
    synced_at = source.synced_at
    store = settings.STORAGES["quor_files"]
    closed = {**store["OPTIONS"], "endpoint_url": "http://127.0.0.1:9"}  # nothing listens
    settings.STORAGES = {**settings.STORAGES, "quor_files": {**store, "OPTIONS": closed}}

    source = synced(source)

    assert source.sync_state == KnowledgeSource.SyncState.FAILED
    assert source.sync_error.startswith(f"s3://{bucket.name}/team/ cannot be listed: ")
    assert source.synced_at == synced_at
    assert KnowledgeDocument.objects.filter(source=source).count() == 1


def test_s3_sources_are_refused_while_the_file_store_is_a_directory(people, settings):
    settings.QUOR_KNOWLEDGE_S3_PREFIXES = ["docs/team"]
    with pytest.raises(InvalidInput, match="file store is a directory"):
        s3_source(people, "docs/team")


# --- starting syncs: the API, the admin, the schedule ---------------------------------


def test_an_admin_starts_a_sync_through_the_api_and_reads_its_state(
    people, folder, client_for, sent, django_capture_on_commit_callbacks
):
    write(folder / "travel.txt", b"Travel by train.")
    source = directory_source(people, folder)
    admin = client_for(people.admin)

    with django_capture_on_commit_callbacks(execute=True):
        response = admin.post(f"/api/v1/knowledge/sources/{source.pk}/sync")
    assert response.status_code == 202, response.content
    assert response.json()["sync_state"] == "idle"
    assert sent == [("knowledge.tasks.sync_source", (str(source.pk),))]

    sync.source_sync(source.pk)  # the task's work
    detail = admin.get(f"/api/v1/knowledge/sources/{source.pk}/").json()
    assert detail["sync_state"] == "idle" and detail["sync_error"] == ""
    assert detail["synced_at"] is not None
    listed = admin.get("/api/v1/knowledge/sources/").json()["results"]
    assert [(s["name"], s["sync_state"]) for s in listed] == [("Handbook", "idle")]


def test_only_the_sources_admins_start_syncs_of_synced_sources(
    people, folder, client_for, sent, django_capture_on_commit_callbacks
):
    source = directory_source(people, folder)
    uploads = services.source_create(organization=people.acme, name="Uploads")
    url = f"/api/v1/knowledge/sources/{source.pk}/sync"
    with django_capture_on_commit_callbacks(execute=True):
        member = client_for(people.reader).post(url)
        foreign = client_for(people.globex_admin).post(url)
        upload = client_for(people.admin).post(f"/api/v1/knowledge/sources/{uploads.pk}/sync")
    assert member.status_code == 403  # as for every source-management call of a member
    assert foreign.status_code == 404
    assert (
        client_for(people.globex_admin).post("/api/v1/knowledge/sources/999999/sync").json()
        == foreign.json()
    )
    assert upload.status_code == 400
    assert upload.json()["error"]["code"] == "knowledge.not_syncable"
    assert sent == []


def test_files_cannot_be_uploaded_into_a_directory_source(people, folder, client_for):
    from django.core.files.uploadedfile import SimpleUploadedFile

    source = directory_source(people, folder)
    response = client_for(people.admin).post(
        f"/api/v1/knowledge/sources/{source.pk}/documents/",
        {"file": SimpleUploadedFile("travel.txt", b"Travel by train.")},
        format="multipart",
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "knowledge.not_an_upload_source"
    assert not source.documents.exists()


def test_the_admin_creates_a_directory_source_and_syncs_it_now(
    people, folder, client, sent, django_capture_on_commit_callbacks
):
    client.force_login(people.admin)
    add = reverse("admin:knowledge_knowledgesource_add")
    outside = client.post(add, {"name": "Server", "kind": "directory", "location": "/etc"})
    assert outside.status_code == 200 and "not inside an allowed directory" in (
        outside.content.decode()
    )
    assert not KnowledgeSource.objects.filter(name="Server").exists()

    with django_capture_on_commit_callbacks(execute=True):
        added = client.post(
            add, {"name": "Handbook", "kind": "directory", "location": f"{folder}/"}
        )
    assert added.status_code == 302, added.content.decode()[-2000:]
    source = KnowledgeSource.objects.get(name="Handbook")
    assert (source.kind, source.location) == (DIRECTORY, os.path.realpath(folder))
    assert sent == [("knowledge.tasks.sync_source", (str(source.pk),))]

    page = client.get(reverse("admin:knowledge_knowledgesource_change", args=[source.pk]))
    assert page.status_code == 200
    assert 'name="location"' not in page.content.decode()  # set once
    assert 'name="upload"' not in page.content.decode()  # its files are its documents

    sent.clear()
    with django_capture_on_commit_callbacks(execute=True):
        client.post(
            reverse("admin:knowledge_knowledgesource_changelist"),
            {"action": "sync_now", "_selected_action": [source.pk]},
        )
    assert sent == [("knowledge.tasks.sync_source", (str(source.pk),))]


def test_every_directory_and_s3_source_is_synced_on_a_schedule(people, folder, settings, sent,
                                                                django_capture_on_commit_callbacks):  # fmt: skip
    from knowledge.tasks import sync_all_sources

    source = directory_source(people, folder)
    services.source_create(organization=people.acme, name="Uploads")
    assert settings.CELERY_BEAT_SCHEDULE["sync-knowledge-sources"] == {
        "task": "knowledge.tasks.sync_all_sources",
        "schedule": 900.0,
    }
    with django_capture_on_commit_callbacks(execute=True):
        assert sync_all_sources() == 1
    assert sent == [("knowledge.tasks.sync_source", (str(source.pk),))]
