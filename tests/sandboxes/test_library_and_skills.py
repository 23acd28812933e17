"""User Library files, Skill bundles and attachments live in the file store: round trips
against a directory and a real S3 server, checked reads, and blobs deleted with their
owners. (The copy into a real sandbox: test_managed_area.py, test_attachments.py.)"""

import hashlib

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from quor import filestore
from quor.lib.errors import CorruptBlob, QuorError
from quor.models import StoredBlob
from sandboxes import skills
from sandboxes.library import files as library
from sandboxes.library.managed import managed_files
from sandboxes.models import Attachment, LibraryFile, Skill
from sandboxes.skills import skill_files
from tests import factories

pytestmark = pytest.mark.django_db

REPORT_FILES = {"SKILL.md": "# Report\nRun make_report.py", "make_report.py": "print('report')"}


def test_a_library_file_uploaded_through_the_api_is_stored_as_a_blob(file_store, owner, client_for):
    api = client_for(owner)
    response = api.put(
        "/api/v1/library/?path=notes/todo.txt",
        data=b"buy milk",
        content_type="application/octet-stream",
    )

    item = LibraryFile.objects.get(owner=owner)
    assert response.status_code == 201
    assert response.json()["size"] == 8
    assert item.sha256 == item.blob.sha256 == hashlib.sha256(b"buy milk").hexdigest()
    assert file_store.keys() == {item.blob.key}
    assert filestore.blob_read(item.blob) == b"buy milk"
    assert api.get("/api/v1/library/").json()["results"][0]["size"] == 8


def test_the_sync_reads_library_files_and_skills_from_the_file_store(file_store, owner, org):
    skills.skill_create(organization=org, name="report", description="d", files=REPORT_FILES)
    library.library_file_put(user=owner, path="notes/todo.txt", content=b"buy milk")
    session = factories.make_session(owner)

    files = managed_files(session)

    assert {path: file.read() for path, file in files.items()} == {
        "skills/report/SKILL.md": b"# Report\nRun make_report.py",
        "skills/report/make_report.py": b"print('report')",
        "library/notes/todo.txt": b"buy milk",
    }
    assert files["library/notes/todo.txt"].sha256 == hashlib.sha256(b"buy milk").hexdigest()


def test_a_damaged_library_file_fails_the_sync_with_a_clear_error(file_store, owner):
    item = library.library_file_put(user=owner, path="notes/todo.txt", content=b"buy milk")
    file_store.write_raw(item.blob.key, b"buy beer")
    session = factories.make_session(owner)

    with pytest.raises(CorruptBlob, match=f"The stored file {item.blob.key} is damaged"):
        managed_files(session)["library/notes/todo.txt"].read()


def test_replacing_a_library_file_deletes_the_old_blob(
    local_file_store, owner, django_capture_on_commit_callbacks
):
    first = library.library_file_put(user=owner, path="notes.txt", content=b"v1").blob

    with django_capture_on_commit_callbacks(execute=True):
        item = library.library_file_put(user=owner, path="notes.txt", content=b"v2")

    assert list(StoredBlob.objects.all()) == [item.blob]
    assert local_file_store.keys() == {item.blob.key} != {first.key}
    assert filestore.blob_read(item.blob) == b"v2"


def test_a_library_file_over_the_limit_is_refused_while_streaming_and_nothing_is_kept(
    local_file_store, owner, settings
):
    settings.QUOR_MAX_ATTACHMENT_BYTES = 10

    with pytest.raises(QuorError) as raised:
        library.library_file_put(user=owner, path="big.bin", content=iter([b"123456", b"78901"]))

    assert (raised.value.code, raised.value.status) == ("request_too_large", 413)
    assert not StoredBlob.objects.exists()
    assert local_file_store.keys() == set()


def test_deleting_a_library_file_deletes_its_blob_and_object(
    local_file_store, owner, client_for, django_capture_on_commit_callbacks
):
    library.library_file_put(user=owner, path="notes.txt", content=b"milk")

    with django_capture_on_commit_callbacks(execute=True):
        response = client_for(owner).delete("/api/v1/library/?path=notes.txt")

    assert response.status_code == 204
    assert not StoredBlob.objects.exists()
    assert local_file_store.keys() == set()


def test_a_skill_bundle_round_trips_and_the_same_files_make_the_same_bytes(file_store, org):
    skill = skills.skill_create(
        organization=org, name="report", description="d", files=REPORT_FILES
    )
    again = skills.skill_create(
        organization=org, name="copy", description="d", files=dict(reversed(REPORT_FILES.items()))
    )

    assert skill_files(skill) == {path: text.encode() for path, text in REPORT_FILES.items()}
    assert skill.bundle.sha256 == again.bundle.sha256
    assert skill.bundle.key != again.bundle.key


def test_a_skill_without_files_has_no_bundle(local_file_store, org):
    skill = skills.skill_create(organization=org, name="empty", description="d", files={})

    assert (skill.bundle, skill_files(skill)) == (None, {})


def test_skill_files_with_a_path_leaving_the_skill_are_refused(local_file_store, org):
    with pytest.raises(QuorError, match=r"must not contain '\.\.'"):
        skills.skill_create(
            organization=org, name="bad", description="d", files={"../escape.sh": "x"}
        )


def test_a_bundle_holding_anything_but_plain_files_is_refused():
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        link = tarfile.TarInfo("SKILL.md")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        archive.addfile(link)

    with pytest.raises(QuorError, match="not a plain file"):
        skills.bundle_unpack(buffer.getvalue())


def test_skills_are_added_and_edited_in_the_admin_as_json(
    local_file_store, client, superuser, org, django_capture_on_commit_callbacks
):
    client.force_login(superuser)
    added = client.post(
        "/admin/sandboxes/skill/add/",
        {
            "organization": org.pk,
            "name": "report",
            "description": "Weekly report",
            "files": '{"SKILL.md": "# Report"}',
        },
    )
    skill = Skill.objects.get(name="report")
    page = client.get(f"/admin/sandboxes/skill/{skill.pk}/change/")
    with django_capture_on_commit_callbacks(execute=True):
        changed = client.post(
            f"/admin/sandboxes/skill/{skill.pk}/change/",
            {
                "organization": org.pk,
                "name": "report",
                "description": "Weekly report",
                "files": '{"SKILL.md": "# Report v2", "run.py": "print(1)"}',
            },
        )
    bad = client.post(
        f"/admin/sandboxes/skill/{skill.pk}/change/",
        {"organization": org.pk, "name": "report", "description": "d", "files": '["x"]'},
    )

    assert added.status_code == changed.status_code == 302
    assert "# Report" in page.content.decode()
    skill.refresh_from_db()
    assert skill_files(skill) == {"SKILL.md": b"# Report v2", "run.py": b"print(1)"}
    assert list(StoredBlob.objects.all()) == [skill.bundle]
    assert local_file_store.keys() == {skill.bundle.key}
    assert bad.status_code == 200
    assert "Files must map paths to text" in bad.content.decode()


def test_the_admin_offers_to_enter_the_files_of_a_damaged_bundle_again(
    local_file_store, client, superuser, org
):
    skill = skills.skill_create(organization=org, name="report", description="d", files={"a": "b"})
    local_file_store.delete_raw(skill.bundle.key)
    client.force_login(superuser)

    page = client.get(f"/admin/sandboxes/skill/{skill.pk}/change/")

    assert page.status_code == 200
    assert "is missing from the file store. Enter the files again." in page.content.decode()


def test_deleting_an_organization_and_a_user_deletes_their_bundles_and_library_blobs(
    local_file_store, owner, org, django_capture_on_commit_callbacks
):
    skills.skill_create(organization=org, name="report", description="d", files=REPORT_FILES)
    library.library_file_put(user=owner, path="notes.txt", content=b"milk")

    with django_capture_on_commit_callbacks(execute=True):
        org.delete()
        owner.delete()

    assert not StoredBlob.objects.exists()
    assert local_file_store.keys() == set()


def test_deleting_a_session_deletes_its_attachments_blobs(
    local_file_store, owner, django_capture_on_commit_callbacks
):
    session = factories.make_session(owner)
    factories.make_attachment(session, "numbers.txt", b"10 20 30\n")

    with django_capture_on_commit_callbacks(execute=True):
        session.delete()

    assert not Attachment.objects.exists()
    assert not StoredBlob.objects.exists()
    assert local_file_store.keys() == set()


@pytest.mark.django_db(transaction=True)
def test_existing_library_files_and_skills_move_into_the_file_store_and_back(local_file_store):
    before, after = (
        ("sandboxes", "0005_session_sharing"),
        ("sandboxes", "0008_remove_inline_contents"),
    )
    try:
        executor = MigrationExecutor(connection)
        executor.migrate([before])
        old = executor.loader.project_state([before]).apps
        org = old.get_model("quor", "Organization").objects.create(name="Acme", slug="acme")
        user = old.get_model("quor", "User").objects.create(email="owner@acme.test")
        old.get_model("sandboxes", "LibraryFile").objects.create(
            owner_id=user.pk, path="notes.txt", content=b"milk", sha256="x"
        )
        old.get_model("sandboxes", "Skill").objects.create(
            organization_id=org.pk, name="report", description="d", files=REPORT_FILES
        )
        executor = MigrationExecutor(connection)
        executor.migrate([after])
        moved = {
            "library": filestore.blob_read(LibraryFile.objects.get().blob),
            "skill": skill_files(Skill.objects.get()),
        }
        executor = MigrationExecutor(connection)
        executor.migrate([before])
        old = executor.loader.project_state([before]).apps
        back = {
            "library": bytes(old.get_model("sandboxes", "LibraryFile").objects.get().content),
            "skill": old.get_model("sandboxes", "Skill").objects.get().files,
        }
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())

    assert moved == {
        "library": b"milk",
        "skill": {path: text.encode() for path, text in REPORT_FILES.items()},
    }
    assert back == {"library": b"milk", "skill": REPORT_FILES}
