"""What the Files panel needs from the files API, in a real sandbox: Quor's own entries
said to be so, the Library read (not written) through its link, folders as archives."""

import http.client
import io
import os
import sys
import tarfile
from pathlib import Path

import pytest

from quor import services as quor_services
from sandboxes.library import files as library
from sandboxes.library.managed import sync_managed_area
from sandboxes.runtime import services
from tests import factories
from tests.conftest import _start, _stop
from tests.docker_helpers import wait_for_http
from tests.environment import free_port

pytestmark = [pytest.mark.docker, pytest.mark.django_db]


@pytest.fixture
def session(owner, running_sandbox):
    """A session with the agent's files, Quor's links to the managed area and AGENTS.md."""
    library.library_file_put(user=owner, path="notes/todo.txt", content=b"buy milk")
    session = factories.make_session(owner, title="files")
    services.session_workspace_ensure(session=session)
    sync_managed_area(session=session)
    script = "mkdir -p src/empty && printf hello > src/hello.py && printf rules > AGENTS.md"
    assert (
        services.sandbox_exec(user=owner, session=session, argv=["sh", "-c", script]).exit_code == 0
    )
    return session


@pytest.fixture
def api(client_for, owner):
    return client_for(owner)


def files(api, session, suffix="", **params):
    return api.get(f"/api/v1/sessions/{session.pk}/files/{suffix}", params)


def archive_names(response) -> list[str]:
    data = b"".join(response.streaming_content)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        return sorted(archive.getnames())


def test_the_listing_says_which_entries_are_quors_own(api, session):
    listing = files(api, session).json()["results"]
    managed = {entry["name"]: entry["managed"] for entry in listing}
    assert managed["library"] == "library"
    assert managed["skills"] == "skills"
    assert managed["AGENTS.md"] == "instructions"
    assert managed["src"] is None
    # A folder of the agent's called AGENTS.md or library elsewhere is just a folder.
    [inner] = [
        e for e in files(api, session, path="src").json()["results"] if e["name"] == "hello.py"
    ]
    assert inner["managed"] is None


def test_the_library_is_listed_and_read_through_its_link_but_not_written(api, session):
    listing = files(api, session, path="library/notes").json()["results"]
    assert [(e["name"], e["type"], e["size"]) for e in listing] == [("todo.txt", "file", 8)]
    content = files(api, session, "content", path="library/notes/todo.txt")
    assert content.status_code == 200
    assert b"".join(content.streaming_content) == b"buy milk"
    upload = api.post(
        f"/api/v1/sessions/{session.pk}/files/content?path=library/notes/todo.txt",
        data=b"sell milk",
        content_type="application/octet-stream",
    )
    assert upload.status_code == 400
    assert upload.json()["error"]["code"] == "files.symlink_refused"


def test_the_whole_session_downloads_as_an_archive_without_quors_own_entries(api, session):
    response = files(api, session, "archive")
    assert response.status_code == 200, response
    assert response["Content-Type"] == "application/gzip"
    assert response["Content-Disposition"].startswith('attachment; filename="session-')
    names = archive_names(response)
    assert "./src/hello.py" in names and "./src/empty" in names
    # Not `.quor/`, the links to the Library and Skills, nor AGENTS.md (Quor writes it).
    top_level = {name.split("/")[1] for name in names if name != "."}
    assert top_level == {"src", "attachments"}, names


def test_a_folder_downloads_as_an_archive_of_its_own(api, session):
    response = files(api, session, "archive", path="src")
    assert response["Content-Disposition"] == 'attachment; filename="src.tar.gz"'
    assert archive_names(response) == ["src", "src/empty", "src/hello.py"]
    library_archive = files(api, session, "archive", path="library")
    assert "library/notes/todo.txt" in archive_names(library_archive)


def test_an_archive_too_large_is_refused_before_anything_is_sent(api, session, settings):
    settings.QUOR_FILES_ARCHIVE_MAX_BYTES = 4
    response = files(api, session, "archive", path="src")
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "files.archive_too_large"
    # The page asks first (`check=1`), and shows the same refusal as a sentence.
    checked = files(api, session, "archive", path="src", check="1")
    assert checked.status_code == 413
    assert checked.json()["error"]["code"] == "files.archive_too_large"


def test_a_check_answers_whether_the_archive_would_be_made_without_making_it(api, session):
    checked = files(api, session, "archive", path="src", check="1")
    assert checked.status_code == 200
    answer = checked.json()
    assert answer["name"] == "src.tar.gz"
    assert answer["size"] >= len("hello")  # du's apparent sizes: folders count too
    assert files(api, session, "archive", path="missing", check="1").status_code == 404


def test_a_folder_in_use_with_unreadable_files_still_downloads_whole(api, session, owner):
    """An app appending to its log while tar reads it (tar exits 1), a file and a folder
    the sandbox user made unreadable (tar exits 2; du counts the folder as empty): the
    archive is made anyway, with what could be read, and ends as a whole .tar.gz."""
    script = (
        "mkdir -p busy/locked && printf ok > busy/ok.txt && printf no > busy/secret"
        " && head -c 4000000 /dev/zero > busy/app.log && chmod 000 busy/secret busy/locked"
        " && (while :; do echo line >> busy/app.log; done) >/dev/null 2>&1 </dev/null &"
        " echo $! > /tmp/quor-test-writer.pid"
    )
    started = services.sandbox_exec(user=owner, session=session, argv=["sh", "-c", script])
    assert started.exit_code == 0, started.stderr
    try:
        assert files(api, session, "archive", path="busy", check="1").status_code == 200
        for _ in range(3):  # tar sees the log change nearly every time; thrice to be sure
            response = files(api, session, "archive", path="busy")
            assert response.status_code == 200
            names = archive_names(response)  # the whole stream: raises if it was cut short
            assert {"busy/ok.txt", "busy/app.log"} <= set(names), names
            assert "busy/secret" not in names and "busy/locked" not in names  # left out
    finally:
        services.sandbox_exec(
            user=owner,
            session=session,
            argv=["sh", "-c", "kill $(cat /tmp/quor-test-writer.pid); chmod -R u+rwx busy"],
        )


def test_download_names_are_sent_safely_whatever_they_hold(api, session, owner):
    script = "mkdir -p 'odd\nname' && printf x > 'odd\nname/résumé.txt'"
    done = services.sandbox_exec(user=owner, session=session, argv=["sh", "-c", script])
    assert done.exit_code == 0, done.stderr
    response = files(api, session, "archive", path="odd\nname")
    assert response.status_code == 200
    assert response["Content-Disposition"] == "attachment; filename*=utf-8''odd%0Aname.tar.gz"
    assert archive_names(response) == ["odd\nname", "odd\nname/résumé.txt"]
    content = files(api, session, "content", path="odd\nname/résumé.txt")
    assert content.status_code == 200
    assert content["Content-Disposition"] == "attachment; filename*=utf-8''r%C3%A9sum%C3%A9.txt"
    assert b"".join(content.streaming_content) == b"x"


def test_only_folders_of_the_owners_session_are_archived(api, session, client_for, colleague):
    not_a_folder = files(api, session, "archive", path="src/hello.py")
    assert not_a_folder.status_code == 400
    assert not_a_folder.json()["error"]["code"] == "files.not_a_directory"
    assert files(api, session, "archive", path="missing").status_code == 404
    assert files(api, session, "archive", path="../x").status_code == 400
    assert files(client_for(colleague), session, "archive").status_code == 404


def _resident_bytes_of_group(group: int) -> int:
    """The resident memory of every process of a process group (/proc/PID/stat)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[2]) == group:
            total += int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    return total


@pytest.mark.django_db(transaction=True)  # the web process must see the session and token
def test_a_large_archive_streams_through_the_web_tier_without_being_held_in_its_memory(
    session, owner, process_env
):
    """Through daphne, as deployed: before the fix Django's ASGI handler read the whole
    archive into a list before sending its first byte."""
    size = 64 * 1024 * 1024
    made = services.sandbox_exec(
        user=owner,
        session=session,
        argv=["sh", "-c", f"mkdir -p big && head -c {size} /dev/urandom > big/data"],
    )
    assert made.exit_code == 0, made.stderr
    port = free_port()
    web = _start(
        [sys.executable, "manage.py", "serve_web", "--bind", "127.0.0.1", "--port", str(port),
         "--processes", "1"],
        process_env,
        f"archive-web-{port}",
    )  # fmt: skip
    try:
        wait_for_http(f"http://127.0.0.1:{port}/healthz")
        token = quor_services.api_token_create(user=owner, name="archive")[1]
        before = _resident_bytes_of_group(web.pid)
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        connection.request(
            "GET",
            f"/api/v1/sessions/{session.pk}/files/archive?path=big",
            headers={"Authorization": f"Bearer {token}"},
        )
        response = connection.getresponse()
        assert response.status == 200
        first = response.read(65536)
        held = _resident_bytes_of_group(web.pid) - before
        rest = 0
        while chunk := response.read(1 << 20):
            rest += len(chunk)
        connection.close()
    finally:
        _stop(web)

    assert len(first) == 65536 and len(first) + rest > size  # random bytes do not shrink
    assert held < size // 2, f"{held / 2**20:.0f} MiB held at the first byte"
