"""Session files through the API: list, upload, download; traversal refused."""

import pytest

from sandboxes.runtime import services
from tests import factories

pytestmark = [pytest.mark.docker, pytest.mark.django_db]


@pytest.fixture
def session(owner, running_sandbox):
    return factories.make_session(owner, title="files")


@pytest.fixture
def api(client_for, owner):
    return client_for(owner)


def url(session, suffix):
    return f"/api/v1/sessions/{session.pk}/{suffix}"


def upload(api, session, path, data: bytes):
    return api.post(
        url(session, f"files/content?path={path}"),
        data=data,
        content_type="application/octet-stream",
    )


def download(api, session, path):
    return api.get(url(session, "files/content"), {"path": path})


def test_upload_list_and_download_round_trip(api, session):
    payload = bytes(range(256)) * 4000
    assert (
        api.post(url(session, "exec/"), {"argv": ["mkdir", "data"]}, format="json").json()[
            "exit_code"
        ]
        == 0
    )
    response = upload(api, session, "data/blob.bin", payload)
    assert response.status_code == 201, response.json()
    assert response.json() == {"name": "blob.bin", "size": len(payload)}

    listing = api.get(url(session, "files/"), {"path": "data"})
    assert listing.status_code == 200
    [entry] = listing.json()["results"]
    assert (entry["name"], entry["type"], entry["size"]) == ("blob.bin", "file", len(payload))

    got = download(api, session, "data/blob.bin")
    assert got.status_code == 200
    assert got["Content-Length"] == str(len(payload))
    assert b"".join(got.streaming_content) == payload


def test_files_live_in_the_sessions_own_directory(api, session, owner):
    upload(api, session, "hello.txt", b"hi")
    result = services.sandbox_exec(
        user=owner, argv=["cat", f"/workspace/sessions/{session.pk}/hello.txt"]
    )
    assert result.stdout == b"hi"
    mode = services.sandbox_exec(
        user=owner, argv=["stat", "-c", "%a %u", f"/workspace/sessions/{session.pk}"]
    )
    assert mode.stdout == b"700 1000\n"


@pytest.mark.parametrize("path", ["../other/x", "/etc/passwd", "a/../../x", "a\x00b"])
def test_traversal_is_refused(api, session, path):
    for response in (download(api, session, path), api.get(url(session, "files/"), {"path": path})):
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "files.invalid_path"


def test_a_symlink_made_inside_the_sandbox_cannot_be_read_through(api, session, owner):
    other = factories.make_session(owner, title="other")
    upload(api, other, "secret.txt", b"other session's data")
    ws = services.session_workspace_ensure(session=session)
    for link, target in [
        ("etc-passwd", "/etc/passwd"),
        ("other", f"/workspace/sessions/{other.pk}"),
        ("up", ".."),
    ]:
        assert (
            services.sandbox_exec(user=owner, argv=["ln", "-s", target, f"{ws}/{link}"]).exit_code
            == 0
        )
    for path in ["etc-passwd", "other/secret.txt", "up/" + str(other.pk) + "/secret.txt"]:
        response = download(api, session, path)
        assert response.status_code == 400, path
        assert response.json()["error"]["code"] == "files.symlink_refused"
    assert api.get(url(session, "files/"), {"path": "other"}).status_code == 400
    assert upload(api, session, "other/planted.txt", b"x").status_code == 400
    assert (
        services.sandbox_exec(
            user=owner, argv=["test", "-e", f"/workspace/sessions/{other.pk}/planted.txt"]
        ).exit_code
        == 1
    )


def test_missing_files_are_404_and_directories_are_not_downloadable(api, session):
    assert download(api, session, "nope.txt").status_code == 404
    upload(api, session, "x.txt", b"x")
    response = download(api, session, ".")
    assert response.status_code == 400


def test_another_users_session_files_are_404(client_for, colleague, session):
    other = client_for(colleague)
    assert other.get(url(session, "files/")).status_code == 404
    assert other.get(url(session, "files/content"), {"path": "x"}).status_code == 404
    assert upload(other, session, "x.txt", b"x").status_code == 404
    assert other.post(url(session, "exec/"), {"argv": ["true"]}, format="json").status_code == 404


def test_exec_through_the_api_runs_in_the_session_workspace(api, session):
    response = api.post(url(session, "exec/"), {"argv": ["pwd"]}, format="json")
    assert response.status_code == 200
    assert response.json()["stdout"] == f"/workspace/sessions/{session.pk}\n"
    bad = api.post(url(session, "exec/"), {"argv": "rm -rf /"}, format="json")
    assert bad.status_code == 400
