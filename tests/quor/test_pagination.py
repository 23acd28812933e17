"""Every list of the API comes in pages (README, "API"): following `next` gives every item
once in a stable order, `previous` walks back, `page_size` is capped, bad parameters are
a 400 in the error format that changes nothing, and another user's items never appear."""

import datetime
import math
from types import SimpleNamespace
from urllib.parse import parse_qs, urlsplit

import pytest
from django.utils import timezone
from drf_spectacular.generators import SchemaGenerator

from approvals.models import ApprovalRequest
from apps.catalog import load_catalog
from quor import services as quor_services
from quor.lib.pagination import sign_cursor
from quor.models import ApiToken, ModelProvider
from sandboxes.api import views as sandbox_views
from sandboxes.library import files as library
from sandboxes.models import LibraryFile, Sandbox, ScheduledRun, ScheduledTask, Session
from sandboxes.runtime import services as sandbox_services
from tests import factories
from webapps.models import WebApp

pytestmark = pytest.mark.django_db

MINE = 7  # items of the requesting user: three pages of 3
PAGE = 3


def pages(client, url, params=None):
    """The bodies of every page from the first one, following `next`."""
    response = client.get(url, params or {})
    bodies = []
    while True:
        assert response.status_code == 200, response.content
        body = response.json()
        assert set(body) == {"next", "previous", "results"}
        bodies.append(body)
        if body["next"] is None:
            return bodies
        assert len(bodies) < 100, "next never ends"
        response = client.get(body["next"])


def backwards(client, last_body):
    """The bodies of the pages before `last_body`, following `previous`."""
    bodies, body = [], last_body
    while body["previous"] is not None:
        response = client.get(body["previous"])
        assert response.status_code == 200, response.content
        body = response.json()
        bodies.append(body)
        assert len(bodies) < 100, "previous never ends"
    return bodies


def error(response):
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    return response.status_code, body["error"]["code"]


def old(seconds: int):
    return timezone.now() - datetime.timedelta(hours=1, seconds=seconds)


# --- one case per list endpoint -------------------------------------------------------------
# Each makes MINE items the requester sees and a few of other users (or organizations),
# and returns (requester, url, the keys of the requester's items in the documented order,
# how to read an item's key).


def sessions_case(owner, colleague, stranger):
    provider = factories.make_provider(owner.membership.organization)
    mine = [factories.make_session(owner, provider, title=f"s{n}") for n in range(MINE)]
    for n in range(3):
        factories.make_session(colleague, provider, title=f"theirs {n}")
    # Ties on created_at are ordered by id, never left to chance.
    Session.objects.filter(pk__in=[s.pk for s in mine[2:5]]).update(created_at=old(0))
    order = Session.objects.filter(owner=owner).order_by("-created_at", "-id")
    return owner, "/api/v1/sessions/", [str(pk) for pk in order.values_list("pk", flat=True)], "id"


def tokens_case(owner, colleague, stranger):
    for n in range(MINE - 1):  # client_for makes the seventh
        quor_services.api_token_create(user=owner, name=f"mine {n}")
    for n in range(3):
        quor_services.api_token_create(user=colleague, name=f"theirs {n}")
    return owner, "/api/v1/tokens/", None, "id"


def tokens_expected(owner):
    order = ApiToken.objects.filter(user=owner).order_by("-created_at", "-id")
    return list(order.values_list("pk", flat=True))


def model_providers_case(owner, colleague, stranger):
    admin = factories.make_user(owner.membership.organization, role="admin")
    ours = [factories.make_provider(owner.membership.organization) for _ in range(MINE)]
    for _ in range(3):
        factories.make_provider(stranger.membership.organization)
    return admin, "/api/v1/model-providers/", sorted(p.pk for p in ours), "id"


def models_case(owner, colleague, stranger):
    org = owner.membership.organization
    first = factories.make_provider(org, model_names=["zeta", "alpha", "mid"])
    second = factories.make_provider(org, model_names=["b", "a", "c", "d"])
    factories.make_provider(org, model_names=["private"], available_to_everyone=False)
    factories.make_provider(stranger.membership.organization, model_names=["theirs"])
    expected = [f"{first.pk}:{name}" for name in ("alpha", "mid", "zeta")]
    expected += [f"{second.pk}:{name}" for name in "abcd"]
    return owner, "/api/v1/models/", expected, "id"


def apps_case(owner, colleague, stranger):
    org = owner.membership.organization
    ours = [factories.make_app(org, name=f"App {MINE - n}") for n in range(MINE)]
    factories.make_app(org, name="Disabled", enabled=False)  # members do not see it
    for n in range(3):
        factories.make_app(stranger.membership.organization, name=f"Theirs {n}")
    return owner, "/api/v1/apps/", [a.pk for a in ours], "id"


def library_case(owner, colleague, stranger):
    for n in range(MINE):
        library.library_file_put(user=owner, path=f"notes/{(n * 5) % MINE}.md", content=b"x")
    for n in range(3):
        library.library_file_put(user=colleague, path=f"notes/theirs-{n}.md", content=b"y")
    order = LibraryFile.objects.filter(owner=owner).order_by("path")
    return owner, "/api/v1/library/", list(order.values_list("path", flat=True)), "path"


def make_task(user, name):
    provider = factories.make_provider(user.membership.organization)
    return ScheduledTask.objects.create(
        owner=user,
        name=name,
        prompt="p",
        cron="0 9 * * *",
        model_provider=provider,
        model_name=provider.model_names[0],
    )


def scheduled_tasks_case(owner, colleague, stranger):
    ours = [make_task(owner, f"task {MINE - n}") for n in range(MINE)]
    for n in range(3):
        make_task(colleague, f"theirs {n}")
    return owner, "/api/v1/scheduled-tasks/", [t.pk for t in ours], "id"


def scheduled_runs_case(owner, colleague, stranger):
    task, theirs = make_task(owner, "mine"), make_task(colleague, "theirs")
    start = timezone.now() - datetime.timedelta(days=30)
    ours = [
        ScheduledRun.objects.create(
            task=task,
            scheduled_for=start + datetime.timedelta(days=(n * 3) % MINE),
            status="finished",
        )
        for n in range(MINE)
    ]
    for n in range(3):
        scheduled_for = start + datetime.timedelta(hours=n)
        ScheduledRun.objects.create(task=theirs, scheduled_for=scheduled_for, status="finished")
    expected = [r.pk for r in sorted(ours, key=lambda r: r.scheduled_for, reverse=True)]
    return owner, f"/api/v1/scheduled-tasks/{task.pk}/runs/", expected, "id"


def make_approval(session, n):
    return ApprovalRequest.objects.create(
        session=session,
        app_name="GitHub",
        actions=[],
        method="POST",
        url=f"https://apps.test/{n}",
        summary=f"request {n}",
        expires_at=timezone.now() + datetime.timedelta(minutes=5),
    )


def approvals_case(owner, colleague, stranger):
    session = factories.make_session(owner)
    ours = [make_approval(session, n) for n in range(MINE)]
    ApprovalRequest.objects.filter(pk__in=[a.pk for a in ours[1:4]]).update(created_at=old(5))
    make_approval(factories.make_session(owner), "another session")
    for n in range(3):
        make_approval(factories.make_session(colleague), n)
    order = session.approval_requests.order_by("-created_at", "-id")
    expected = [str(pk) for pk in order.values_list("pk", flat=True)]
    return owner, f"/api/v1/sessions/{session.pk}/approvals/", expected, "id"


def webapps_case(owner, colleague, stranger):
    session = factories.make_session(owner)
    ports = [9000 - 10 * n for n in range(MINE)]
    for port in ports:
        WebApp.objects.create(session=session, port=port, command="serve")
    WebApp.objects.create(session=factories.make_session(owner), port=7000, command="other")
    WebApp.objects.create(session=factories.make_session(colleague), port=7001, command="x")
    return owner, f"/api/v1/sessions/{session.pk}/webapps/", sorted(ports), "port"


CASES = {
    "sessions": sessions_case,
    "tokens": tokens_case,
    "model providers": model_providers_case,
    "models": models_case,
    "apps": apps_case,
    "library": library_case,
    "scheduled tasks": scheduled_tasks_case,
    "scheduled runs": scheduled_runs_case,
    "approvals": approvals_case,
    "web apps": webapps_case,
}


@pytest.fixture(params=list(CASES))
def case(request, owner, colleague, stranger, client_for):
    user, url, expected, key = CASES[request.param](owner, colleague, stranger)
    client = client_for(user)
    if expected is None:
        expected = tokens_expected(user)
    return client, url, expected, key


def test_pages_hold_every_item_once_in_a_stable_order(case):
    client, url, expected, key = case
    assert len(expected) == MINE
    bodies = pages(client, url, {"page_size": PAGE})
    assert [len(b["results"]) for b in bodies] == [3, 3, 1]
    assert [item[key] for b in bodies for item in b["results"]] == expected
    assert bodies[0]["previous"] is None
    # Back from the last page: the same pages, in reverse.
    back = backwards(client, bodies[-1])
    assert [[i[key] for i in b["results"]] for b in back] == [
        [i[key] for i in b["results"]] for b in reversed(bodies[:-1])
    ]
    # The same request again: the same pages.
    assert [[i[key] for i in b["results"]] for b in pages(client, url, {"page_size": PAGE})] == [
        [i[key] for i in b["results"]] for b in bodies
    ]


def test_the_default_page_size_and_the_cap(case, settings):
    client, url, expected, key = case
    settings.QUOR_API_PAGE_SIZE = 2
    settings.QUOR_API_MAX_PAGE_SIZE = 4
    assert [len(b["results"]) for b in pages(client, url)] == [2, 2, 2, 1]
    for too_many in ("5", "1000", "9" * 40):
        bodies = pages(client, url, {"page_size": too_many})
        assert [len(b["results"]) for b in bodies] == [4, 3]
        assert [i[key] for b in bodies for i in b["results"]] == expected


def test_the_catalog_is_paginated_by_key(client_for, owner):
    keys = sorted(load_catalog())
    assert len(keys) > 2
    bodies = pages(client_for(owner), "/api/v1/apps/catalog/", {"page_size": 2})
    assert [e["key"] for b in bodies for e in b["results"]] == keys
    assert len(bodies) == math.ceil(len(keys) / 2)


def test_items_added_while_paging_do_not_shift_the_pages(client_for, owner):
    provider = factories.make_provider(owner.membership.organization)
    for n in range(MINE):
        factories.make_session(owner, provider, title=f"s{n}")
    client = client_for(owner)
    order = Session.objects.order_by("-created_at", "-id")
    expected = [str(pk) for pk in order.values_list("pk", flat=True)]
    first = client.get("/api/v1/sessions/", {"page_size": PAGE}).json()
    factories.make_session(owner, provider, title="newest")  # before the first page's items
    seen = [s["id"] for s in first["results"]]
    body = first
    while body["next"]:
        body = client.get(body["next"]).json()
        seen += [s["id"] for s in body["results"]]
    assert seen == expected


def test_another_users_cursor_shows_only_their_own_items(client_for, owner, colleague):
    provider = factories.make_provider(owner.membership.organization)
    for _ in range(MINE):
        factories.make_session(owner, provider)
    factories.make_session(colleague, provider)
    next_link = client_for(owner).get("/api/v1/sessions/", {"page_size": 2}).json()["next"]
    body = client_for(colleague).get(next_link).json()
    shown = Session.objects.filter(pk__in=[s["id"] for s in body["results"]])
    assert set(shown.values_list("owner", flat=True)) <= {colleague.pk}


# --- bad parameters -------------------------------------------------------------------------

BAD_PAGE_SIZES = ["0", "000", "-1", "abc", "", "2.5", "1e3", " 3", "³", "3 "]


def test_a_bad_page_size_is_a_400_that_changes_nothing(case):
    client, url, _, _ = case
    before = snapshot()
    for value in BAD_PAGE_SIZES:
        response = client.get(url, {"page_size": value})
        assert error(response) == (400, "pagination.invalid_page_size"), value
    assert snapshot() == before


def cursor_of(link: str) -> str:
    return parse_qs(urlsplit(link).query)["cursor"][0]


def tampered(token: str) -> str:
    value, _, signature = token.rpartition(":")
    return f"{value[:-1]}{'A' if value[-1] != 'A' else 'B'}:{signature}"


def test_a_bad_cursor_is_a_400_that_changes_nothing(case):
    client, url, _, _ = case
    token = cursor_of(client.get(url, {"page_size": 2}).json()["next"])
    assert client.get(url, {"cursor": token, "page_size": 2}).status_code == 200
    # Signed by Quor, but for another list: its positions mean nothing here.
    elsewhere = sign_cursor(
        SimpleNamespace(path="/api/v1/elsewhere/"), {"o": 0, "r": False, "p": "1"}
    )
    unsigned = "eyJvIjowfQ"  # base64 of {"o":0}, a cursor as DRF would take it
    before = snapshot()
    for cursor in ("abc", "", tampered(token), token + "x", elsewhere, unsigned, "é"):
        response = client.get(url, {"cursor": cursor, "page_size": 2})
        assert error(response) == (400, "pagination.invalid_cursor"), cursor
    assert snapshot() == before


def snapshot():
    """What a request could change: every list's rows and each sandbox's activity (set
    long ago at the first call, so that any mark of activity shows)."""
    if Sandbox.objects.filter(last_activity_at__gt=old(-1800)).exists():
        Sandbox.objects.update(last_activity_at=old(0))
    return {
        "sessions": sorted(Session.objects.values_list("pk", "updated_at")),
        "sandboxes": sorted(Sandbox.objects.values_list("pk", "last_activity_at", "state")),
        "approvals": sorted(ApprovalRequest.objects.values_list("pk", "status")),
        "tokens": sorted(ApiToken.objects.values_list("pk", "revoked_at")),
        "providers": sorted(ModelProvider.objects.values_list("pk", "updated_at")),
        "runs": sorted(ScheduledRun.objects.values_list("pk", "status")),
        "webapps": sorted(WebApp.objects.values_list("pk", "status")),
    }


# --- the session's events: their own paging by seq ----------------------------------------------


@pytest.fixture
def session_with_events(owner):
    from sandboxes.sessions.events import session_events_append

    session = factories.make_session(owner)
    session_events_append(
        session=session, events=[("assistant_text", {"text": str(n)}) for n in range(5)]
    )
    return session


def test_events_come_in_pages_after_a_seq(client_for, owner, colleague, session_with_events):
    client = client_for(owner)
    url = f"/api/v1/sessions/{session_with_events.pk}/events/"
    bodies = pages(client, url, {"page_size": 2})
    assert [[e["seq"] for e in b["results"]] for b in bodies] == [[1, 2], [3, 4], [5]]
    assert all(b["previous"] is None for b in bodies)
    assert "after=4" in bodies[1]["next"] and "page_size=2" in bodies[1]["next"]
    body = client.get(url, {"after": 5}).json()
    assert (body["results"], body["next"]) == ([], None)  # caught up
    assert client_for(colleague).get(url).status_code == 404


def test_events_per_call_are_capped(client_for, owner, session_with_events, monkeypatch):
    monkeypatch.setattr(sandbox_views, "EVENTS_PER_PAGE", 3)
    client = client_for(owner)
    url = f"/api/v1/sessions/{session_with_events.pk}/events/"
    for params in ({}, {"page_size": 10}):
        bodies = pages(client, url, params)
        assert [[e["seq"] for e in b["results"]] for b in bodies] == [[1, 2, 3], [4, 5]]


def test_a_bad_events_page_size_is_a_400_that_changes_nothing(
    client_for, owner, session_with_events
):
    client = client_for(owner)
    url = f"/api/v1/sessions/{session_with_events.pk}/events/"
    before = snapshot()
    for value in BAD_PAGE_SIZES:
        response = client.get(url, {"page_size": value})
        assert error(response) == (400, "pagination.invalid_page_size"), value
    assert snapshot() == before


# --- directory listings: bounded, with a flag ----------------------------------------------------


def test_a_directory_listing_is_bounded_and_says_when_there_is_more(
    client_for, owner, settings, monkeypatch
):
    session = factories.make_session(owner)
    entries = [
        {"name": f"f{n}", "type": "file", "size": n, "modified": 1.0, "managed": None}
        for n in range(5)
    ]
    monkeypatch.setattr(sandbox_services, "session_files_list", lambda **kwargs: entries)
    client = client_for(owner)
    url = f"/api/v1/sessions/{session.pk}/files/"
    settings.QUOR_FILES_LIST_LIMIT = 3
    body = client.get(url).json()
    assert body == {"results": entries[:3], "truncated": True}
    settings.QUOR_FILES_LIST_LIMIT = 5
    assert client.get(url).json() == {"results": entries, "truncated": False}


# --- no unbounded list left ---------------------------------------------------------------------


def test_no_endpoint_answers_a_bare_list():
    """A guard for endpoints to come: a GET whose answer is a JSON array is unbounded."""
    schema = SchemaGenerator().get_schema(request=None, public=True)
    components = schema["components"]["schemas"]
    bare = []
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            for status, response in operation.get("responses", {}).items():
                content = response.get("content", {}).get("application/json", {})
                body = content.get("schema", {})
                if "$ref" in body:
                    body = components[body["$ref"].rsplit("/", 1)[1]]
                if body.get("type") == "array":
                    bare.append((method.upper(), path, status))
    assert bare == []
