"""Sessions through the API: creating, following up, cancelling, events; bad input."""

import pytest
from django.test import override_settings

from quor.models import Membership
from sandboxes.models import AgentEvent, Sandbox, Session
from sandboxes.sessions import services as sessions
from sandboxes.sessions.events import session_events_append
from tests import factories


@pytest.fixture
def api(client_for, owner):
    return client_for(owner)


@pytest.mark.django_db(transaction=True)
def test_creating_a_session_records_the_prompt_and_queues_the_agent(api, owner, model_id, queued):
    response = api.post(
        "/api/v1/sessions/", {"prompt": "Write hello.py", "model": model_id}, format="json"
    )
    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["title"], body["model"], body["status"]) == ("Write hello.py", model_id, "pending")
    session = Session.objects.get(pk=body["id"])
    assert session.sandbox == Sandbox.objects.get(user=owner)
    assert list(session.events.values_list("seq", "kind")) == [(1, "user_message")]
    assert queued == [str(session.pk)]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"prompt": "", "model": "{model}"}, 400, "invalid_input"),
        ({"prompt": "   ", "model": "{model}"}, 400, "sessions.empty_message"),
        ({"prompt": "hi", "model": "999:nope"}, 400, "models.unknown_model"),
        ({"prompt": "hi"}, 400, "invalid_input"),
        ({"prompt": "hi", "model": "{model}", "tools": ["x"]}, 400, "invalid_input"),
    ],
)
def test_bad_session_requests_create_nothing(api, model_id, queued, body, status, code):
    body = {k: (v.format(model=model_id) if isinstance(v, str) else v) for k, v in body.items()}
    response = api.post("/api/v1/sessions/", body, format="json")
    assert response.status_code == status
    assert response.json()["error"]["code"] == code
    assert not Session.objects.exists()
    assert queued == []


@pytest.mark.django_db
@override_settings(QUOR_MAX_PROMPT_CHARS=10)
def test_an_overlong_prompt_is_refused(api, model_id, queued):
    response = api.post("/api/v1/sessions/", {"prompt": "x" * 11, "model": model_id}, format="json")
    assert response.json()["error"]["code"] == "sessions.message_too_long"
    assert not Session.objects.exists()


@pytest.mark.django_db
def test_members_without_sandbox_or_model_access_are_refused(api, owner, org, model_id, queued):
    provider = factories.make_provider(org, available_to_everyone=False, model_names=["secret"])
    response = api.post(
        "/api/v1/sessions/", {"prompt": "hi", "model": f"{provider.pk}:secret"}, format="json"
    )
    assert (response.status_code, response.json()["error"]["code"]) == (
        403,
        "access.model_not_allowed",
    )
    Membership.objects.filter(user=owner).update(can_use_sandbox=False)
    response = api.post("/api/v1/sessions/", {"prompt": "hi", "model": model_id}, format="json")
    assert (response.status_code, response.json()["error"]["code"]) == (
        403,
        "access.sandbox_not_allowed",
    )
    assert not Session.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_follow_up_continues_only_a_session_that_is_not_working(api, owner, queued):
    session = factories.make_session(owner, status=Session.Status.RUNNING)
    url = f"/api/v1/sessions/{session.pk}/messages/"
    busy = api.post(url, {"text": "and now?"}, format="json")
    assert (busy.status_code, busy.json()["error"]["code"]) == (409, "sessions.busy")
    Session.objects.filter(pk=session.pk).update(status=Session.Status.WAITING)
    ok = api.post(url, {"text": "and now?"}, format="json")
    assert ok.status_code == 202
    assert ok.json()["status"] == "pending"
    assert session.events.get().payload == {"text": "and now?"}
    assert queued == [str(session.pk)]


@pytest.mark.django_db
def test_another_users_session_is_404_for_every_action(client_for, colleague, owner, queued):
    session = factories.make_session(owner, status=Session.Status.WAITING)
    other = client_for(colleague)
    for method, suffix, body in [
        ("post", "messages/", {"text": "hi"}),
        ("post", "cancel/", None),
        ("get", "events/", None),
    ]:
        response = getattr(other, method)(
            f"/api/v1/sessions/{session.pk}/{suffix}", body, format="json"
        )
        assert response.status_code == 404, suffix
    assert not AgentEvent.objects.exists()


@pytest.mark.django_db
def test_cancelling_a_finished_session_is_a_conflict(api, owner):
    session = factories.make_session(owner, status=Session.Status.WAITING)
    response = api.post(f"/api/v1/sessions/{session.pk}/cancel/")
    assert (response.status_code, response.json()["error"]["code"]) == (409, "sessions.not_running")
    assert not session.events.exists()


@pytest.mark.django_db
def test_cancelling_a_pending_session_records_it(api, owner):
    session = factories.make_session(owner, status=Session.Status.PENDING)
    response = api.post(f"/api/v1/sessions/{session.pk}/cancel/")
    assert response.json()["status"] == "cancelled"
    assert session.events.get().kind == "cancelled"


@pytest.mark.django_db
def test_events_are_listed_after_a_seq(api, owner):
    session = factories.make_session(owner)
    session_events_append(
        session=session, events=[("assistant_text", {"text": str(n)}) for n in range(5)]
    )
    events = api.get(f"/api/v1/sessions/{session.pk}/events/", {"after": 2}).json()["results"]
    assert [e["seq"] for e in events] == [3, 4, 5]
    for refused in ("x", "-1", "²"):
        response = api.get(f"/api/v1/sessions/{session.pk}/events/", {"after": refused})
        assert response.status_code == 400, refused


@pytest.mark.django_db
def test_the_runtime_reports_events_for_its_own_sandboxs_sessions_only(owner, colleague):
    from rest_framework.test import APIClient

    from sandboxes.models import hash_token

    session = factories.make_session(owner, status=Session.Status.RUNNING)
    Sandbox.objects.filter(pk=session.sandbox_id).update(
        runtime_credential_hash=hash_token("cred-a")
    )
    foreign = factories.make_session(colleague, status=Session.Status.RUNNING)
    runtime = APIClient()
    runtime.credentials(HTTP_AUTHORIZATION="Bearer cred-a")
    url = "/api/v1/runtime/sessions/{}/events/"
    events = {
        "events": [
            {"kind": "assistant_text", "payload": {"text": "hi"}},
            {"kind": "turn_finished", "payload": {}},
        ]
    }
    assert runtime.post(url.format(session.pk), events, format="json").json() == {"last_seq": 2}
    session.refresh_from_db()
    assert session.status == Session.Status.WAITING
    assert runtime.post(url.format(foreign.pk), events, format="json").status_code == 404
    bad = runtime.post(
        url.format(session.pk), {"events": [{"kind": "rm -rf", "payload": {}}]}, format="json"
    )
    assert (bad.status_code, bad.json()["error"]["code"]) == (400, "sessions.invalid_events")
    assert APIClient().post(url.format(session.pk), events, format="json").status_code == 401
    assert not foreign.events.exists()


def runtime_client(session):
    from rest_framework.test import APIClient

    from sandboxes.models import hash_token

    Sandbox.objects.filter(pk=session.sandbox_id).update(
        runtime_credential_hash=hash_token("cred-turns")
    )
    runtime = APIClient()
    runtime.credentials(HTTP_AUTHORIZATION="Bearer cred-turns")
    return runtime


def test_an_agent_of_a_turn_that_ended_is_refused_and_an_agent_of_the_current_turn_is_seen(
    owner,
):
    session = factories.make_session(owner, status=Session.Status.RUNNING)
    [old_turn] = session_events_append(session=session, events=[("session_started", {})])
    [new_turn] = session_events_append(session=session, events=[("session_started", {})])
    runtime = runtime_client(session)
    heartbeat = f"/api/v1/runtime/sessions/{session.pk}/heartbeat/"
    events = f"/api/v1/runtime/sessions/{session.pk}/events/"
    text = [{"kind": "assistant_text", "payload": {"text": "still here"}}]

    for refused in (
        runtime.post(heartbeat, {"turn": old_turn.seq}, format="json"),
        runtime.post(events, {"events": text, "turn": old_turn.seq}, format="json"),
    ):
        assert (refused.status_code, refused.json()["error"]["code"]) == (
            409, "sessions.turn_ended"
        )  # fmt: skip
    assert session.events.count() == 2  # nothing stored
    session.refresh_from_db()
    assert session.agent_seen_at is None

    assert runtime.post(heartbeat, {"turn": new_turn.seq}, format="json").status_code == 204
    reported = runtime.post(events, {"events": text, "turn": new_turn.seq}, format="json")
    assert reported.json() == {"last_seq": 3}
    session.refresh_from_db()
    assert session.agent_seen_at is not None

    Session.objects.filter(pk=session.pk).update(status=Session.Status.WAITING)
    ended = runtime.post(heartbeat, {"turn": new_turn.seq}, format="json")
    assert (ended.status_code, ended.json()["error"]["code"]) == (409, "sessions.turn_ended")
    bad = runtime.post(heartbeat, {"turn": "soon"}, format="json")
    assert bad.status_code == 400


@pytest.mark.django_db(transaction=True)
def test_concurrent_reports_get_consecutive_seqs_without_duplicates(owner):
    import threading

    from django.db import connection

    session = factories.make_session(owner)

    def report():
        for _ in range(10):
            session_events_append(session=session, events=[("assistant_text_delta", {"text": "x"})])
        connection.close()

    threads = [threading.Thread(target=report) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert list(session.events.order_by("seq").values_list("seq", flat=True)) == list(range(1, 41))


@pytest.mark.django_db
@override_settings(QUOR_MAX_ATTACHMENTS=1, QUOR_MAX_ATTACHMENT_BYTES=5)
def test_too_many_or_too_large_attachments_are_refused_before_anything_starts(
    api, model_id, queued
):
    from django.core.files.uploadedfile import SimpleUploadedFile

    for files, code in [
        (
            [SimpleUploadedFile("a.txt", b"1"), SimpleUploadedFile("b.txt", b"2")],
            "sessions.too_many_attachments",
        ),
        ([SimpleUploadedFile("big.txt", b"123456")], "sessions.attachment_too_large"),
    ]:
        response = api.post(
            "/api/v1/sessions/",
            {"prompt": "hi", "model": model_id, "attachments": files},
            format="multipart",
        )
        assert (response.status_code, response.json()["error"]["code"]) == (400, code)
    assert not Session.objects.exists()
    assert not Sandbox.objects.exists()
    assert queued == []


@pytest.mark.django_db
def test_a_finishing_turn_never_ends_the_next_turn_started_by_a_follow_up(owner):
    from sandboxes.sessions.services import _end_turn

    session = factories.make_session(owner, status=Session.Status.RUNNING)
    [first] = session_events_append(session=session, events=[("session_started", {})])
    session_events_append(session=session, events=[("turn_finished", {})])
    [second] = session_events_append(session=session, events=[("session_started", {})])
    _end_turn(session, first.seq, Session.Status.WAITING)  # the first turn's task, late
    session.refresh_from_db()
    assert session.status == Session.Status.RUNNING
    _end_turn(session, second.seq, Session.Status.WAITING)
    session.refresh_from_db()
    assert session.status == Session.Status.WAITING


@pytest.mark.django_db
def test_a_reported_end_of_turn_commits_with_its_event(owner):
    session = factories.make_session(owner, status=Session.Status.RUNNING)
    sessions.session_events_report(
        session=session, events=[{"kind": "turn_finished", "payload": {}}]
    )
    session.refresh_from_db()
    assert session.status == Session.Status.WAITING


@pytest.mark.django_db
def test_a_json_array_or_an_unknown_skill_creates_no_session(api, model_id, queued):
    assert api.post("/api/v1/sessions/", [1, 2], format="json").status_code == 400
    response = api.post(
        "/api/v1/sessions/", {"prompt": "hi", "model": model_id, "skills": ["nope"]}, format="json"
    )
    assert (response.status_code, response.json()["error"]["code"]) == (
        400,
        "sessions.unknown_skill",
    )
    assert not Session.objects.exists()


@pytest.mark.django_db
def test_the_user_library_is_managed_through_the_api(api, owner, client_for, colleague):
    put = api.put(
        "/api/v1/library/?path=notes/todo.txt",
        data=b"buy milk",
        content_type="application/octet-stream",
    )
    assert put.status_code == 201
    assert put.json()["size"] == 8
    listed = api.get("/api/v1/library/").json()["results"]
    assert [f["path"] for f in listed] == ["notes/todo.txt"]
    assert client_for(colleague).get("/api/v1/library/").json()["results"] == []
    bad = api.put("/api/v1/library/?path=../x", data=b"x", content_type="application/octet-stream")
    assert bad.json()["error"]["code"] == "files.invalid_path"
    assert api.delete("/api/v1/library/?path=notes/todo.txt").status_code == 204
    assert api.delete("/api/v1/library/?path=notes/todo.txt").status_code == 404


@pytest.mark.django_db
def test_using_a_session_through_the_api_is_activity_on_its_sandbox(api, owner):
    from datetime import timedelta

    from django.utils import timezone

    session = factories.make_session(owner)
    long_ago = timezone.now() - timedelta(hours=1)
    Sandbox.objects.filter(pk=session.sandbox_id).update(last_activity_at=long_ago)
    assert api.get(f"/api/v1/sessions/{session.pk}/events/").status_code == 200
    session.sandbox.refresh_from_db()
    assert session.sandbox.last_activity_at > long_ago
    other = factories.make_session(factories.make_user(owner.membership.organization))
    Sandbox.objects.filter(pk=other.sandbox_id).update(last_activity_at=long_ago)
    assert api.get(f"/api/v1/sessions/{other.pk}/events/").status_code == 404
    other.sandbox.refresh_from_db()
    assert other.sandbox.last_activity_at == long_ago  # someone else's: no activity
