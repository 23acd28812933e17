"""Scheduled tasks through the API: the owner's alone (others get 404), bad input."""

import pytest

from apps.models import App
from sandboxes.models import ScheduledRun, ScheduledTask, Session


@pytest.mark.django_db
def test_the_owner_creates_a_task_and_reads_it_back(client_for, owner, org, model_id):
    app = App.objects.create(organization=org, name="GitHub", url_patterns=["https://gh.test"])
    api = client_for(owner)
    body = {
        "name": "Weekly digest",
        "prompt": "Digest the week",
        "cron": "0 8 * * 1",
        "timezone": "Europe/Paris",
        "model": model_id,
        "apps": [app.pk],
        "preapproved_apps": [app.pk],
    }
    response = api.post("/api/v1/scheduled-tasks/", body, format="json")
    assert response.status_code == 201, response.json()
    created = response.json()
    assert {k: created[k] for k in body} == body
    assert created["enabled"] is True
    assert created["next_run_at"] and created["last_run"] is None
    assert api.get(f"/api/v1/scheduled-tasks/{created['id']}/").json() == created
    listed = api.get("/api/v1/scheduled-tasks/").json()["results"]
    assert [t["id"] for t in listed] == [created["id"]]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("changes", "code"),
    [
        ({"cron": "every day"}, "scheduled.invalid_cron"),
        ({"timezone": "Paris"}, "scheduled.invalid_timezone"),
        ({"model": "999:nope"}, "models.unknown_model"),
        ({"preapproved_apps": ["{app}"]}, "scheduled.preapproved_not_selected"),
        ({"cron": "0 9 * * *", "schedule": "daily"}, "invalid_input"),
        ({"cron": None}, "invalid_input"),
    ],
)
def test_bad_task_requests_are_refused_and_create_nothing(
    client_for, owner, org, model_id, changes, code
):
    app = App.objects.create(organization=org, name="GitHub", url_patterns=["https://gh.test"])
    changes = {k: [app.pk] if v == ["{app}"] else v for k, v in changes.items()}
    body = {"name": "n", "prompt": "p", "cron": "0 9 * * *", "model": model_id, **changes}
    response = client_for(owner).post("/api/v1/scheduled-tasks/", body, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == code
    assert not ScheduledTask.objects.exists()


@pytest.mark.django_db
def test_patch_changes_only_the_given_fields(client_for, owner, task):
    api = client_for(owner)
    url = f"/api/v1/scheduled-tasks/{task.pk}/"
    response = api.patch(url, {"cron": "30 7 * * *", "enabled": False}, format="json")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert (body["name"], body["cron"], body["enabled"], body["next_run_at"]) == (
        "Daily report",
        "30 7 * * *",
        False,
        None,
    )
    bad = api.patch(url, {"cron": "99 * * * *"}, format="json")
    assert bad.json()["error"]["code"] == "scheduled.invalid_cron"
    task.refresh_from_db()
    assert task.cron == "30 7 * * *"


@pytest.mark.django_db
def test_run_now_and_the_runs_list(client_for, owner, task, queued):
    api = client_for(owner)
    response = api.post(f"/api/v1/scheduled-tasks/{task.pk}/run/")
    assert response.status_code == 201, response.json()
    run = response.json()
    assert run["status"] == "running"
    assert Session.objects.get(pk=run["session"]).owner == owner
    again = api.post(f"/api/v1/scheduled-tasks/{task.pk}/run/")
    assert (again.status_code, again.json()["error"]["code"]) == (409, "scheduled.run_in_progress")
    runs = api.get(f"/api/v1/scheduled-tasks/{task.pk}/runs/").json()["results"]
    assert [r["id"] for r in runs] == [run["id"]]
    assert api.get(f"/api/v1/scheduled-tasks/{task.pk}/").json()["last_run"]["id"] == run["id"]


def _requests(task_id):
    base = f"/api/v1/scheduled-tasks/{task_id}/"
    return [
        ("get", base, None),
        ("patch", base, {"name": "taken over"}),
        ("get", f"{base}runs/", None),
        ("post", f"{base}run/", None),
        ("delete", base, None),
    ]


@pytest.mark.django_db
@pytest.mark.parametrize("persona", ["colleague", "stranger"])
def test_another_users_task_is_404_for_every_request(request, client_for, task, queued, persona):
    other = client_for(request.getfixturevalue(persona))
    assert other.get("/api/v1/scheduled-tasks/").json()["results"] == []
    for method, url, body in _requests(task.pk):
        response = getattr(other, method)(url, body, format="json")
        assert response.status_code == 404, (method, url)
        assert response.json()["error"]["code"] == "not_found"
    task.refresh_from_db()
    assert task.name == "Daily report"
    assert not ScheduledRun.objects.exists()


@pytest.mark.django_db
def test_anonymous_requests_are_401(api_client, task, queued):
    assert api_client.get("/api/v1/scheduled-tasks/").status_code == 401
    assert api_client.post("/api/v1/scheduled-tasks/", {}, format="json").status_code == 401
    for method, url, body in _requests(task.pk):
        response = getattr(api_client, method)(url, body, format="json")
        assert response.status_code == 401, (method, url)
    assert ScheduledTask.objects.filter(pk=task.pk).exists()


@pytest.mark.django_db
def test_the_owner_deletes_a_task(client_for, owner, task):
    api = client_for(owner)
    assert api.delete(f"/api/v1/scheduled-tasks/{task.pk}/").status_code == 204
    assert api.get(f"/api/v1/scheduled-tasks/{task.pk}/").status_code == 404
    assert not ScheduledTask.objects.exists()


@pytest.mark.django_db
def test_a_malformed_task_id_is_404(client_for, owner):
    response = client_for(owner).get("/api/v1/scheduled-tasks/abc/")
    assert response.status_code == 404
