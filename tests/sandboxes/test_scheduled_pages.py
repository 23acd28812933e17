"""The scheduled tasks UI pages (server-rendered)."""

import re

import pytest

from apps.models import App
from sandboxes.models import ScheduledRun, ScheduledTask, Session
from sandboxes.scheduling import services as scheduled


@pytest.mark.django_db
def test_the_list_shows_the_tasks_next_run_in_its_zone_and_its_last_run(logged_in, task, queued):
    assert "No scheduled tasks" not in logged_in.get("/scheduled/").content.decode()
    page = logged_in.get("/scheduled/").content.decode()
    assert "Daily report" in page
    assert "09:00" in page and "Europe/Paris" in page
    assert "Never" in page
    scheduled.run_now(user=task.owner, task=task)
    page = logged_in.get("/scheduled/").content.decode()
    assert "status-running" in page


@pytest.mark.django_db
def test_the_navigation_links_to_scheduled_tasks(logged_in):
    page = logged_in.get("/").content.decode()
    assert 'href="/scheduled/"' in page
    assert "No scheduled tasks yet" in logged_in.get("/scheduled/").content.decode()


@pytest.mark.django_db
def test_the_form_creates_a_task(logged_in, org, model_id):
    github = App.objects.create(organization=org, name="GitHub", url_patterns=["https://gh.test"])
    page = logged_in.get("/scheduled/new").content.decode()
    assert f'value="{model_id}"' in page and 'name="preapproved_apps"' in page
    response = logged_in.post(
        "/scheduled/new",
        {
            "name": "Weekly digest",
            "prompt": "Digest the week",
            "cron": "0 8 * * 1",
            "timezone": "Europe/Paris",
            "model": model_id,
            "apps": [str(github.pk)],
            "preapproved_apps": [str(github.pk)],
            "enabled": "on",
        },
    )
    task = ScheduledTask.objects.get()
    assert response["Location"] == f"/scheduled/{task.pk}/"
    assert (task.name, task.cron, task.timezone, task.enabled) == (
        "Weekly digest",
        "0 8 * * 1",
        "Europe/Paris",
        True,
    )
    assert list(task.preapproved_apps.all()) == [github]
    page = logged_in.get(response["Location"]).content.decode()
    assert "Weekly digest" in page and "(pre-approved)" in page and "No runs yet" in page


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("cron", "0 9 * *", "has 4 fields"),
        ("timezone", "Mars/Base", "is not a known time zone"),
        ("preapproved_apps", "{app}", "Pre-approved Apps must also be selected"),
    ],
)
def test_a_bad_form_shows_the_reason_keeps_the_input_and_stores_nothing(
    logged_in, org, model_id, field, value, message
):
    app = App.objects.create(organization=org, name="Slack", url_patterns=["https://slack.test"])
    values = {"name": "Digest", "prompt": "Digest it", "cron": "0 9 * * *", "model": model_id}
    values["timezone"] = "UTC"
    values[field] = str(app.pk) if value == "{app}" else value
    response = logged_in.post("/scheduled/new", values)
    assert response.status_code == 400
    page = response.content.decode()
    assert "Nothing was saved" in page
    assert message in page
    assert 'value="Digest"' in page and "Digest it</textarea>" in page
    assert re.search(r'<p class="errors">[^<]*' + re.escape(message), page)  # beside the field
    assert not ScheduledTask.objects.exists()


@pytest.mark.django_db
def test_the_edit_form_changes_the_task(logged_in, task, model_id):
    page = logged_in.get(f"/scheduled/{task.pk}/edit").content.decode()
    assert 'value="0 9 * * *"' in page
    response = logged_in.post(
        f"/scheduled/{task.pk}/edit",
        {
            "name": "Morning report",
            "prompt": "Summarise",
            "cron": "30 7 * * *",
            "timezone": "Europe/Paris",
            "model": model_id,
        },
    )
    assert response["Location"] == f"/scheduled/{task.pk}/"
    task.refresh_from_db()
    assert (task.name, task.cron, task.enabled) == ("Morning report", "30 7 * * *", True)


@pytest.mark.django_db
def test_the_task_page_lists_runs_with_links_to_their_sessions(logged_in, task, queued):
    logged_in.post(f"/scheduled/{task.pk}/run")
    run = ScheduledRun.objects.get()
    page = logged_in.get(f"/scheduled/{task.pk}/").content.decode()
    assert f'href="/sessions/{run.session_id}/"' in page
    assert "Running" in page and "Started by hand" in page


@pytest.mark.django_db
def test_run_now_opens_the_new_session_and_a_second_one_shows_why_not(logged_in, task, queued):
    response = logged_in.post(f"/scheduled/{task.pk}/run")
    session = Session.objects.get()
    assert response["Location"] == f"/sessions/{session.pk}/"
    response = logged_in.post(f"/scheduled/{task.pk}/run", follow=True)
    assert b"is still going" in response.content
    assert Session.objects.count() == 1


@pytest.mark.django_db
def test_disable_enable_and_delete_buttons(logged_in, task):
    logged_in.post(f"/scheduled/{task.pk}/enable", {"enabled": "0"})
    task.refresh_from_db()
    assert (task.enabled, task.next_run_at) == (False, None)
    assert "Disabled" in logged_in.get(f"/scheduled/{task.pk}/").content.decode()
    logged_in.post(f"/scheduled/{task.pk}/enable", {"enabled": "1"})
    task.refresh_from_db()
    assert task.enabled and task.next_run_at is not None
    response = logged_in.post(f"/scheduled/{task.pk}/delete")
    assert response["Location"] == "/scheduled/"
    assert not ScheduledTask.objects.exists()


@pytest.mark.django_db
def test_other_peoples_task_pages_are_404(client, colleague, task):
    client.force_login(colleague)
    for method, suffix in [
        ("get", ""),
        ("get", "edit"),
        ("post", "edit"),
        ("post", "enable"),
        ("post", "run"),
        ("post", "delete"),
    ]:
        assert getattr(client, method)(f"/scheduled/{task.pk}/{suffix}").status_code == 404
    assert "Daily report" not in client.get("/scheduled/").content.decode()
    assert ScheduledTask.objects.filter(pk=task.pk, enabled=True).exists()


@pytest.mark.django_db
def test_pages_need_login(client, task):
    for url in ["/scheduled/", "/scheduled/new", f"/scheduled/{task.pk}/"]:
        assert client.get(url)["Location"].startswith("/accounts/login/")
