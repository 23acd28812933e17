"""The session forms keep what was typed on an error, and sessions can be renamed,
deleted and searched (pages and API)."""

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import override_settings

from approvals.models import ApprovalRequest
from sandboxes.models import AgentEvent, Attachment, ScheduledRun, Session, Skill
from sandboxes.sessions.services import title_from_prompt
from tests import factories
from webapps.models import WebApp


@pytest.fixture
def choices(org):
    """A model, a Skill and an App to choose on the new-session form."""
    provider = factories.make_provider(org, model_names=["m-one", "m-two"])
    Skill.objects.create(organization=org, name="report", description="Reports")
    app = factories.make_app(org, name="Tracker")
    return {"model": f"{provider.pk}:m-two", "skill": "report", "app": str(app.pk)}


def _new_session(logged_in, choices, **fields):
    form = {
        "prompt": "Summarise the notes",
        "title": "My notes",
        "model": choices["model"],
        "skills": [choices["skill"]],
        "apps": [choices["app"]],
        **fields,
    }
    return logged_in.post("/sessions/new", form)


@pytest.mark.django_db
@override_settings(QUOR_MAX_PROMPT_CHARS=50)
def test_a_prompt_over_the_limit_comes_back_with_everything_typed(logged_in, choices):
    prompt = "Tell me a long story about the sea, with whales, storms and a lighthouse"
    response = _new_session(logged_in, choices, prompt=prompt)
    assert response.status_code == 400
    page = response.content.decode()
    assert f">{prompt}</textarea>" in page
    assert 'value="My notes"' in page
    assert f'<option value="{choices["model"]}" selected>' in page
    assert 'value="report" checked' in page
    assert f'value="{choices["app"]}" checked' in page
    assert 'id="prompt-error">The message is longer than 50 characters.' in page
    assert 'data-max-chars="50"' in page
    assert not Session.objects.exists()


@pytest.mark.django_db
@override_settings(QUOR_MAX_ATTACHMENT_BYTES=10)
def test_a_too_big_attachment_keeps_the_form_and_asks_for_the_files_again(logged_in, choices):
    upload = SimpleUploadedFile("big.csv", b"x" * 11)
    response = _new_session(logged_in, choices, attachments=[upload])
    assert response.status_code == 400
    page = response.content.decode()
    assert ">Summarise the notes</textarea>" in page
    assert 'id="attachments-error">big.csv is larger than 10 bytes. Choose the files again.' in page
    assert 'data-max-file-bytes="10"' in page
    assert not Session.objects.exists() and not Attachment.objects.exists()


@pytest.mark.django_db
def test_an_unknown_app_is_shown_beside_the_apps(logged_in, choices):
    response = _new_session(logged_in, choices, apps=["999999"])
    assert response.status_code == 400
    assert 'id="apps-error">' in response.content.decode()
    assert not Session.objects.exists()


@pytest.mark.django_db
def test_a_refused_follow_up_keeps_its_text(logged_in, owner):
    session = factories.make_session(owner, status=Session.Status.RUNNING)
    response = logged_in.post(f"/sessions/{session.pk}/follow-up", {"text": "And then?"})
    assert response.status_code == 400
    assert response.context["follow_up"] == {
        "text": "And then?",
        "error": "The agent is still working on this session.",
    }
    page = response.content.decode()
    assert 'aria-invalid="true">And then?</textarea>' in page
    assert "The agent is still working on this session.</p>" in page
    assert not session.events.exists()


@pytest.mark.django_db
@override_settings(QUOR_MAX_PROMPT_CHARS=10)
def test_the_scheduled_task_form_keeps_a_prompt_over_the_limit(logged_in, model_id):
    form = {"name": "Daily", "prompt": "x" * 11, "cron": "0 9 * * *", "timezone": "UTC"}
    response = logged_in.post("/scheduled/new", {**form, "model": model_id})
    assert response.status_code == 400
    page = response.content.decode()
    assert f">{'x' * 11}</textarea>" in page
    assert 'data-max-chars="10"' in page
    assert 'id="prompt-error">' in page


@pytest.mark.parametrize(
    ("prompt", "title"),
    [
        ("Print the first ten primes", "Print the first ten primes"),
        ("  Two lines\nsecond line", "Two lines"),
        (
            "Write a program that reads a CSV of sales, groups them by region and month "
            "and plots the totals",
            "Write a program that reads a CSV of sales, groups them by region and month and…",
        ),
        ("x" * 100, "x" * 79 + "…"),
    ],
)
def test_a_title_from_a_prompt_is_short_and_cut_between_words(prompt, title):
    assert title_from_prompt(prompt) == title
    assert len(title_from_prompt(prompt)) <= 80


@pytest.mark.django_db(transaction=True)
def test_a_session_started_with_a_long_prompt_gets_a_short_title(logged_in, org, queued):
    provider = factories.make_provider(org)
    prompt = "Please analyse " + "the quarterly figures " * 800
    logged_in.post("/sessions/new", {"prompt": prompt, "model": f"{provider.pk}:claude-test"})
    session = Session.objects.get()
    assert (
        session.title == "Please analyse the quarterly figures the quarterly figures the quarterly…"
    )
    assert session.events.get(kind="user_message").payload["text"] == prompt


@pytest.mark.django_db
def test_rename_from_the_list_and_bad_titles_change_nothing(logged_in, owner):
    session = factories.make_session(owner, title="Old name")
    page = logged_in.get("/?q=old").content.decode()
    assert f'href="/sessions/{session.pk}/rename?next=%2F%3Fq%3Dold"' in page
    form = logged_in.get(f"/sessions/{session.pk}/rename?next=%2F%3Fq%3Dold").content.decode()
    assert 'value="Old name"' in form

    for bad in ["   ", "y" * 201]:
        response = logged_in.post(f"/sessions/{session.pk}/rename", {"title": bad})
        assert response.status_code == 400
        assert "A title has 1 to 200 characters." in response.content.decode()
    session.refresh_from_db()
    assert session.title == "Old name"

    response = logged_in.post(
        f"/sessions/{session.pk}/rename", {"title": " New name ", "next": "/?q=old"}
    )
    assert response["Location"] == "/?q=old"
    session.refresh_from_db()
    assert session.title == "New name"


@pytest.mark.django_db
def test_rename_and_delete_are_the_owners_only(client, owner, colleague):
    session = factories.make_session(owner, title="Mine")
    client.force_login(colleague)
    assert client.post(f"/sessions/{session.pk}/rename", {"title": "Theirs"}).status_code == 404
    assert client.post(f"/sessions/{session.pk}/delete").status_code == 404
    session.refresh_from_db()
    assert session.title == "Mine"


@pytest.mark.django_db
def test_rename_does_not_return_to_another_site(logged_in, owner):
    session = factories.make_session(owner)
    response = logged_in.post(
        f"/sessions/{session.pk}/rename", {"title": "T", "next": "https://evil.test/"}
    )
    assert response["Location"] == "/"


@pytest.mark.django_db
def test_deleting_asks_first_then_removes_the_session_and_what_belongs_to_it(
    logged_in, owner, org, task
):
    session = factories.make_session(owner, title="Old work", status=Session.Status.WAITING)
    factories.make_event(session, 1, kind="user_message", text="hi")
    factories.make_attachment(session)
    WebApp.objects.create(session=session, port=8000, command="python -m http.server")
    app = factories.make_app(org)
    ApprovalRequest.objects.create(
        session=session, app=app, app_name=app.name, actions=[], method="GET",
        url="https://a.test/", summary="Read", status=ApprovalRequest.Status.APPROVED,
        expires_at=session.created_at,
    )  # fmt: skip
    run = ScheduledRun.objects.create(
        task=task, scheduled_for=session.created_at, session=session, status="finished"
    )

    confirm = logged_in.get(f"/sessions/{session.pk}/delete")
    assert confirm.status_code == 200
    assert b"Delete session" in confirm.content
    assert Session.objects.filter(pk=session.pk).exists()

    response = logged_in.post(f"/sessions/{session.pk}/delete", {"next": "/"})
    assert response["Location"] == "/"
    assert not Session.objects.filter(pk=session.pk).exists()
    assert not AgentEvent.objects.filter(session_id=session.pk).exists()
    assert not Attachment.objects.exists() and not WebApp.objects.exists()
    assert not ApprovalRequest.objects.exists()
    run.refresh_from_db()
    assert run.session is None


@pytest.mark.django_db
@pytest.mark.parametrize("status", [Session.Status.PENDING, Session.Status.RUNNING])
def test_a_session_the_agent_works_on_cannot_be_deleted(logged_in, owner, status):
    session = factories.make_session(owner, status=status)
    response = logged_in.post(f"/sessions/{session.pk}/delete")
    assert response.status_code == 409
    assert "stop it before deleting it" in response.content.decode()
    assert Session.objects.filter(pk=session.pk).exists()


@pytest.mark.django_db
def test_search_finds_sessions_by_title_and_by_prompt(logged_in, owner, colleague):
    by_title = factories.make_session(owner, title="Quarterly REPORT")
    by_prompt = factories.make_session(owner, title="Untitled")
    factories.make_event(by_prompt, 1, kind="user_message", text="Draft the quarterly report")
    by_reply = factories.make_session(owner, title="Other")
    factories.make_event(by_reply, 1, kind="assistant_text", text="quarterly report done")
    theirs = factories.make_session(colleague, title="quarterly report")

    found = logged_in.get("/", {"q": " quarterly report "}).context["sessions"]
    assert set(found) == {by_title, by_prompt}
    assert theirs not in found
    page = logged_in.get("/", {"q": "nothing like it"}).content.decode()
    assert "No session matching “nothing like it”" in page
    assert len(logged_in.get("/").context["sessions"]) == 3


@pytest.mark.django_db
def test_the_api_renames_and_deletes(client_for, owner):
    api = client_for(owner)
    session = factories.make_session(owner, title="Old", status=Session.Status.WAITING)
    url = f"/api/v1/sessions/{session.pk}/"

    response = api.patch(url, {"title": "New", "sharing": "nobody"}, format="json")
    assert response.status_code == 400
    session.refresh_from_db()
    assert session.title == "Old"  # the sharing was refused: the title did not change either

    assert api.patch(url, {}, format="json").status_code == 400
    assert api.patch(url, {"title": ""}, format="json").json()["error"]["code"] == (
        "sessions.invalid_title"
    )
    assert api.patch(url, {"title": "New"}, format="json").json()["title"] == "New"

    running = factories.make_session(owner, status=Session.Status.RUNNING)
    refused = api.delete(f"/api/v1/sessions/{running.pk}/")
    assert (refused.status_code, refused.json()["error"]["code"]) == (409, "sessions.busy")
    assert api.delete(url).status_code == 204
    assert api.get(url).status_code == 404
