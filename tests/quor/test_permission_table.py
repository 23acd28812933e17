"""Every URL pattern and WebSocket route, asked by every persona, answers as the
permission table (quor/lib/permissions.py) and each view's declaration predict.

A view's declaration is read from the view itself (`required_permission(s)`, the
admin's `admin_permissions`); the persona's role says whether they hold it; which
objects fill the URL says whose they are. What each answer means:
- "login": 401, or a redirect to a login page;
- "refused": 403;
- "hidden": 404 (or, in the admin, a redirect away from an object it does not show);
- "allowed": anything else below 500.
"""

import copy
import re
from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db import transaction
from django.test import Client
from django.urls import URLResolver, get_resolver
from django.utils import timezone
from rest_framework.test import APIClient

from approvals.models import ApprovalRequest
from knowledge.models import KnowledgeDocument, KnowledgeSource
from quor import services
from quor.admin import OrganizationAdminAccess
from quor.audit import audit_record
from quor.lib.permissions import (
    OPERATOR,
    PUBLIC,
    SANDBOX_CREDENTIAL,
    SCIM_CLIENT,
    Permission,
    declared_permission,
    role_has,
)
from quor.models import AuditEntry, EmailDomain, Membership, SingleSignOn, User
from quor.service_accounts import service_account_create, service_account_token_create
from sandboxes.library.files import library_file_put
from sandboxes.models import (
    ExecRecord,
    Sandbox,
    ScheduledTask,
    Session,
    Skill,
    TerminalOutput,
    TerminalRecording,
)
from sandboxes.terminal.services import terminal_recording_finish
from tests import factories
from webapps.models import PublicLink, PublicLinkPolicy, SessionConfidentiality, Tunnel, WebApp

Role = Membership.Role
METHODS = ["get", "post", "put", "patch", "delete"]
OWN = "own"  # objects of the member persona
ORGANIZATION = "organization"  # objects of the member's organization
NOWHERE = "nowhere"  # a path nothing answers
EVERYONES = "everyone's"  # each persona's own (sandbox, library file)
QUERIES = {"api-library": "?path=notes.txt"}


@dataclass
class Persona:
    name: str
    user: User | None
    role: str | None = None
    organization: str | None = None


@dataclass
class World:
    personas: list
    member: User
    clients: dict  # (persona name, API or not) -> client
    kwargs: dict  # URL name -> (kwargs, scope)
    admin_objects: dict  # model -> object id


def _personas(acme, globex):
    def user(org, role, email):
        return factories.make_user(org, role=role, email=email)

    return [
        Persona("anonymous", None),
        Persona("owner", user(acme, Role.OWNER, "owner@acme.test"), Role.OWNER, "acme"),
        Persona("admin", user(acme, Role.ADMIN, "admin@acme.test"), Role.ADMIN, "acme"),
        Persona("member", user(acme, Role.MEMBER, "member@acme.test"), Role.MEMBER, "acme"),
        Persona("auditor", user(acme, Role.AUDITOR, "auditor@acme.test"), Role.AUDITOR, "acme"),
        Persona(
            "other organization's admin",
            user(globex, Role.OWNER, "owner@globex.test"),
            Role.OWNER,
            "globex",
        ),
        Persona(
            "superuser",
            User.objects.create_superuser(email="root@quor.test", password=factories.PASSWORD),
        ),
    ]


def _own_sandbox_and_library_file(user):
    Sandbox.objects.get_or_create(user=user)
    library_file_put(user=user, path="notes.txt", content=b"notes")


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker):
    """One world for the module's tests, built once (each test's requests are rolled
    back), and rolled back when they are done."""
    with django_db_blocker.unblock(), transaction.atomic():
        yield build_world()
        transaction.set_rollback(True)


def build_world():
    acme = factories.make_org(name="Acme", slug="acme")
    globex = factories.make_org(name="Globex", slug="globex")
    personas = _personas(acme, globex)
    member = next(p.user for p in personas if p.name == "member")
    clients = {(p.name, api): _client_for(p, api) for p in personas for api in (False, True)}
    provider = factories.make_provider(acme)
    session = factories.make_session(member, provider)
    webapp = WebApp.objects.create(session=session, port=8080, command="python3 -m http.server")
    link = PublicLink.objects.create(
        webapp=webapp,
        requests_per_minute=60,
        bandwidth_bytes=10**6,
        expires_at=timezone.now() + timedelta(days=1),
        created_by=member,
    )
    tunnel = Tunnel.objects.create(
        owner=member, organization=acme, port=8000, expires_at=timezone.now() + timedelta(hours=1)
    )
    app = factories.make_app(acme, actions=[("issues.create", "POST", "/issues", "ask")])
    approval = ApprovalRequest.objects.create(
        session=session,
        app=app,
        app_name=app.name,
        actions=[{"key": "issues.create", "name": "Create an issue", "policy": "ask"}],
        method="POST",
        url="https://apps.test/issues",
        summary="Create an issue",
        expires_at=timezone.now() + timedelta(minutes=5),
    )
    task = ScheduledTask.objects.create(
        owner=member,
        name="Daily",
        prompt="Summarise",
        cron="0 9 * * *",
        model_provider=provider,
        model_name=provider.model_names[0],
    )
    token, _ = services.api_token_create(user=member, name="laptop")
    source = KnowledgeSource.objects.create(organization=acme, name="Policies")
    document = KnowledgeDocument.objects.create(
        source=source, title="Travel", external_id="travel.txt", content_type="text"
    )
    for persona in personas:
        if persona.role is not None:
            _own_sandbox_and_library_file(persona.user)
    robot = service_account_create(organization=acme, name="CI", scopes=["sessions"])
    robot_token, _ = service_account_token_create(account=robot)
    own = {"session_id": session.pk, "label": webapp.label}
    record = ExecRecord.objects.create(
        organization=acme,
        user=member,
        session=session,
        via=ExecRecord.Via.API,
        request_hash="0" * 64,
        argv=["true"],
        cwd="/workspace",
        timeout_s=10,
        status=ExecRecord.Status.FINISHED,
        runner="test",
        exit_code=0,
        started_at=timezone.now(),
        deadline=timezone.now(),
    )
    recording = TerminalRecording.objects.create(
        organization=acme, user=member, session=session, width=80, height=24,
        started_at=timezone.now(),
    )  # fmt: skip
    TerminalOutput.objects.create(recording=recording, at=0.1, kind="o", data="$ ")
    terminal_recording_finish(recording_id=recording.pk, reason="The shell ended.")
    kwargs = {
        "session-detail": own,
        "session-terminal-recording": {**own, "recording_id": recording.pk},
        "session-follow-up": own,
        "session-cancel": own,
        "session-rename": own,
        "session-delete": own,
        "webapp-view": own,
        "session-public-link-create": own,
        "session-public-link-revoke": {"session_id": session.pk, "link_id": link.pk},
        "webapp-open": own,
        "scheduled-detail": {"task_id": task.pk},
        "scheduled-edit": {"task_id": task.pk},
        "scheduled-enable": {"task_id": task.pk},
        "scheduled-run": {"task_id": task.pk},
        "scheduled-delete": {"task_id": task.pk},
        "api-token-revoke": {"token_id": token.pk},
        "api-token-detail": {"pk": token.pk},
        "api-session-detail": {"pk": session.pk},
        "api-session-cancel": {"pk": session.pk},
        "api-session-events": {"pk": session.pk},
        "api-session-messages": {"pk": session.pk},
        "api-session-webapps": {"pk": session.pk},
        "api-session-public-links": {"pk": session.pk},
        "api-public-link": {"link_id": link.pk},
        "api-public-link-visits": {"link_id": link.pk},
        "api-tunnel": {"tunnel_id": tunnel.pk},
        "api-scheduled-task-detail": {"pk": task.pk},
        "api-scheduled-task-run": {"pk": task.pk},
        "api-scheduled-task-runs": {"pk": task.pk},
        "api-approval-decision": {"approval_id": approval.pk},
        "api-session-approvals": own,
        "api-session-exec": own,
        "api-session-execs": own,
        "api-session-exec-record": {**own, "exec_id": record.pk},
        "api-session-files": own,
        "api-session-file-content": own,
        "api-session-files-archive": own,
        "api-runtime-session-events": own,
        "api-runtime-session-heartbeat": own,
        "api-runtime-session-webapps": own,
    }
    everyones = {"api-my-sandbox": {}, "api-library": {}, "api-tunnels": {}}
    operator = {
        "operator-organization": {"slug": "acme"},
        "operator-members": {"slug": "acme"},
        "operator-member": {"slug": "acme", "member_id": member.membership.pk},
        "operator-sandbox": {"sandbox_id": session.sandbox_id},
        "operator-sandbox-stop": {"sandbox_id": session.sandbox_id},
        "operator-sandbox-destroy": {"sandbox_id": session.sandbox_id},
        "scim-user": {"resource_id": member.pk},
        "scim-group": {"resource_id": "1"},
        "scim-resource-type": {"name": "User"},
        "scim-schema": {"schema_id": "urn:ietf:params:scim:schemas:core:2.0:User"},
    }
    organization_kwargs = {
        "terminal-recording-audit": {"recording_id": recording.pk},
        "app-credential-set": {"app_id": app.pk},
        "app-credential-clear": {"app_id": app.pk},
        "model-provider-detail": {"pk": provider.pk},
        "api-app-action": {"app_id": app.pk, "key": "issues.create"},
        "api-app-credential": {"app_id": app.pk},
        "api-app-detail": {"pk": app.pk},
        "api-knowledge-source": {"source_id": source.pk},
        "api-knowledge-source-sync": {"source_id": source.pk},
        "api-knowledge-source-documents": {"source_id": source.pk},
        "api-knowledge-document": {"document_id": document.pk},
        "api-knowledge-document-access": {"document_id": document.pk},
        "api-service-account": {"account_id": robot.pk},
        "api-service-account-tokens": {"account_id": robot.pk},
        "api-service-account-token": {"account_id": robot.pk, "token_id": robot_token.pk},
    }
    table = {name: (values, OWN) for name, values in kwargs.items()}
    table |= {name: (values, ORGANIZATION) for name, values in organization_kwargs.items()}
    table |= {name: (values, EVERYONES) for name, values in everyones.items()}
    table |= {name: (values, None) for name, values in operator.items()}
    skill = Skill.objects.create(organization=acme, name="report", description="Reports")
    entry = audit_record("app.added", target=app, organization=acme)
    sso = SingleSignOn.objects.create(
        organization=acme, issuer="https://login.acme.test", client_id="quor"
    )
    domain = factories.make_verified_domain(acme, "acme.test")
    admin_objects = {
        EmailDomain: domain.pk,
        PublicLink: link.pk,
        PublicLinkPolicy: acme.pk,
        SessionConfidentiality: session.pk,
        SingleSignOn: sso.pk,
        AuditEntry: entry.pk,
        Skill: skill.pk,
        Membership: member.membership.pk,
        type(provider): provider.pk,
        type(app): app.pk,
        ApprovalRequest: approval.pk,
        KnowledgeSource: source.pk,
        KnowledgeDocument: document.pk,
        Session: session.pk,
        ScheduledTask: task.pk,
        ExecRecord: record.pk,
        TerminalRecording: recording.pk,
    }
    return World(personas, member, clients, table, admin_objects)


def _site_patterns(patterns=None, prefix=""):
    """(route, name, view) of every URL pattern outside the admin."""
    for pattern in get_resolver().url_patterns if patterns is None else patterns:
        if isinstance(pattern, URLResolver):
            if str(pattern.pattern) == "admin/":
                continue
            yield from _site_patterns(pattern.url_patterns, prefix + str(pattern.pattern))
        else:
            yield prefix + str(pattern.pattern), pattern.name, pattern.callback


SITE_PATTERNS = sorted(
    {(name or route): (route, name, view) for route, name, view in _site_patterns()}.values(),
    key=lambda entry: entry[0],
)


def _declaration(view, method):
    """What the view at this URL declares for this method (None: nothing)."""
    view_class = getattr(view, "cls", None)
    if view_class is None:
        view_class = getattr(view, "view_class", None)
    if view_class is not None and hasattr(view_class, "as_view") and hasattr(view, "cls"):
        actions = getattr(view, "actions", None) or {}
        action = actions.get(method, method)
        permission_classes = [c.__name__ for c in view_class.permission_classes]
        if permission_classes == ["AllowAny"]:
            return PUBLIC
        return declared_permission(view_class, action)
    return getattr(view, "required_permission", None)


def _outcome(response) -> str:
    status = response.status_code
    location = response.get("Location", "")
    assert status < 500, (status, response.content[:500])
    if status == 401 or (status == 302 and "login/" in location and "next=" in location):
        return "login"
    if status == 403:
        return "refused"
    if status == 404:
        return "hidden"
    if status == 405:
        return "method"
    return "allowed"


def expected_answer(persona, permission, scope) -> str:
    if scope == NOWHERE:
        return "hidden"
    if permission == PUBLIC:
        return "allowed"
    if persona.user is None or permission in (SANDBOX_CREDENTIAL, OPERATOR, SCIM_CLIENT):
        return "login"  # neither a session nor a personal token is these endpoints' credential
    if persona.role is None or not role_has(persona.role, permission):
        return "refused"
    if scope == OWN and persona.name != "member":
        return "hidden"
    if scope == ORGANIZATION and persona.organization != "acme":
        return "hidden"
    return "allowed"


def _client_for(persona, api: bool):
    if api:
        client = APIClient()
        if persona.user is not None:
            _, raw = services.api_token_create(user=persona.user, name="walk")
            client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
        return client
    client = Client()
    if persona.user is not None:
        client.force_login(persona.user)
    return client


def _ask(client, path, method):
    """One request, with everything it changes rolled back (the client's cookies too:
    the logout URL would sign it out for the module's later tests)."""
    cookies = copy.deepcopy(client.cookies)
    with transaction.atomic():
        response = getattr(client, method)(path)
        transaction.set_rollback(True)
    client.cookies = cookies
    return response


def fill_route(route, values):
    path = route
    for key, value in values.items():
        path = path.replace(f"(?P<{key}>\\d+)", str(value))
        path = path.replace(f"(?P<{key}>[^/.]+)", str(value))
        for converter in ("str:", "int:", "slug:", "uuid:", ""):
            path = path.replace(f"<{converter}{key}>", str(value))
    return "/" + path.replace("^", "").replace("$", "")


def test_every_site_url_declares_a_permission():
    undeclared = [
        route
        for route, _, view in SITE_PATTERNS
        if not any(_declaration(view, method) for method in METHODS)
    ]
    assert undeclared == []


# The routes whose answer to the owner comes from the sandbox or the Docker Engine itself.
NEEDS_DOCKER = {"api-session-files", "api-session-files-archive", "readyz"}


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("route", "name", "view"),
    [
        pytest.param(*entry, marks=[pytest.mark.docker] if entry[1] in NEEDS_DOCKER else [])
        for entry in SITE_PATTERNS
    ],
    ids=[name or route for route, name, _ in SITE_PATTERNS],
)
def test_every_persona_gets_the_answer_the_table_declares(world, route, name, view):
    if "(?P<unmatched>" in route:
        path, scope = "/api/nothing-here/", NOWHERE
    else:
        values, scope = world.kwargs.get(name, ({}, None))
        path = fill_route(route, values) + QUERIES.get(name, "")
        assert "<" not in path and "(?P" not in path, f"no object fills {route}"
    api = path.startswith("/api/")
    mismatches = []
    for method in METHODS:
        permission = _declaration(view, method)
        if permission is None:
            continue
        probe = next(
            (p for p in world.personas if expected_answer(p, permission, scope) == "allowed"), None
        )
        answers = {}
        if probe:
            answers[probe.name] = _outcome(_ask(world.clients[probe.name, api], path, method))
            if answers[probe.name] == "method":
                continue  # the URL takes no such method
        for persona in world.personas:
            if persona.name not in answers:  # the probe's answer is not asked for again
                answers[persona.name] = _outcome(
                    _ask(world.clients[persona.name, api], path, method)
                )
        if set(answers.values()) <= {"method", "login"} and "method" in answers.values():
            continue  # the URL takes no such method
        for persona in world.personas:
            expected = expected_answer(persona, permission, scope)
            got = answers[persona.name]
            if got != expected and not (got == "method" and expected in ("allowed", "hidden")):
                mismatches.append((method, persona.name, expected, got))
    assert mismatches == [], f"{path} ({name}): " + "; ".join(
        f"{method} {persona}: expected {expected}, got {got}"
        for method, persona, expected, got in mismatches
    )


# --- the admin site ----------------------------------------------------------------------

ADMIN_ACTIONS = {"changelist": "view", "add": "add", "history": "view", "delete": "delete",
                 "change": "view"}  # fmt: skip


def _admin_patterns():
    """(route, name, model admin or None) of every admin URL pattern."""
    by_route = {
        f"admin/{m._meta.app_label}/{m._meta.model_name}/": ma
        for m, ma in admin.site._registry.items()
    }
    for route, name, _ in _walk(admin.site.get_urls(), "admin/"):
        model_admin = next(
            (ma for prefix, ma in by_route.items() if route.startswith(prefix)), None
        )
        yield route, name, model_admin


def _walk(patterns, prefix):
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            yield from _walk(pattern.url_patterns, prefix + str(pattern.pattern))
        else:
            yield prefix + str(pattern.pattern), pattern.name, pattern.callback


ADMIN_PATTERNS = sorted(
    _admin_patterns(),
    key=lambda entry: entry[0],
)
ADMIN_PERSONAS = ["anonymous", "owner", "admin", "member", "auditor", "other organization's admin"]


def _admin_declared(model_admin, action):
    """The role permission the model's admin declares for an action; None: superusers only."""
    if not isinstance(model_admin, OrganizationAdminAccess):
        return None
    return model_admin.admin_permissions[action]


def _admin_expected(persona, model_admin, action, object_scope) -> str:
    if persona.user is None or not role_has(persona.role, Permission.ORGANIZATION_VIEW):
        return "login"
    permission = _admin_declared(model_admin, action)
    if permission is None or not role_has(persona.role, permission):
        return "refused"
    if object_scope and persona.organization != "acme":
        return "hidden"
    return "allowed"


def _admin_outcome(response) -> str:
    if response.status_code == 302 and response["Location"] == "/admin/":
        return "hidden"  # the admin's "does not exist" redirect
    return _outcome(response)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("route", "name", "model_admin"),
    ADMIN_PATTERNS,
    ids=[route for route, _, _ in ADMIN_PATTERNS],
)
def test_every_persona_gets_the_admin_answer_the_table_declares(world, route, name, model_admin):
    personas = [p for p in world.personas if p.name in ADMIN_PERSONAS]
    action = (name or "_change").rsplit("_", 1)[-1] if model_admin else name
    object_id = world.admin_objects.get(model_admin.model) if model_admin else None
    path = "/" + route.replace("<path:object_id>", str(object_id or 1)).replace("<id>", "1")
    if model_admin is None:
        path = _fill_admin_site_route(path)
    mismatches = []
    for persona in personas:
        got = _admin_outcome(_ask(world.clients[persona.name, False], path, "get"))
        if model_admin is None:
            expected = _admin_site_expected(persona, name, path)
        elif name is None:  # <object_id>/: a redirect to the change page, walked itself
            expected = (
                "login" if _admin_expected(persona, None, "view", False) == "login" else "allowed"
            )
        elif action == "history" and not _exists(model_admin.model, object_id or 1):
            # Django looks the object up before it checks the permission.
            expected = (
                "login" if _admin_expected(persona, None, "view", False) == "login" else "hidden"
            )
        elif action == "autocomplete" or action not in ADMIN_ACTIONS:
            expected = _admin_expected(persona, model_admin, "view", object_scope=True)
            if expected == "allowed":
                expected = got if got in ("allowed", "hidden") else "allowed"
        else:
            expected = _admin_expected(
                persona, model_admin, ADMIN_ACTIONS[action], object_scope="object_id" in route
            )
        if got != expected and not (got == "method" and expected == "allowed"):
            mismatches.append(f"{persona.name}: expected {expected}, got {got}")
    assert mismatches == [], f"{path} ({name}): " + "; ".join(mismatches)


def _exists(model, pk) -> bool:
    try:
        return model._default_manager.filter(pk=pk).exists()
    except (ValueError, ValidationError):
        return False  # not a key of this model (a UUID)


def _fill_admin_site_route(path):
    """The app list of `auth` (only superusers see its models), any unknown admin path."""
    path = re.sub(r"\(\?P<app_label>[^)]*\)", "auth", path)
    path = path.replace("<path:content_type_id>", "1").replace("(?P<url>.*)", "nothing-here/")
    return path.replace("^", "").replace("$", "")


def _admin_site_expected(persona, name, path) -> str:
    enters = persona.user is not None and role_has(persona.role, Permission.ORGANIZATION_VIEW)
    if name == "login":
        return "hidden" if enters else "allowed"  # one who may enter goes to the index
    if name == "logout" and not enters:
        return "hidden"  # the admin sends them to its index, which asks them to sign in
    if not enters:
        return "login"
    if name in ("app_list", None):
        return "hidden"
    if name in ("autocomplete",):
        return "refused"
    if name == "view_on_site":
        return "hidden"
    return "allowed"
