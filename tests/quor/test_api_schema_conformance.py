"""The API answers what /api/schema/ documents: schemathesis, with every check and its
stateful phase, against the app in this process, as a member with a personal API token.

Bounded (a few examples per operation; the coverage phase's boundary cases are most of
the ~2 800 requests, about 90 s) and derandomized (a fixed seed), so that it runs in
`make test` and never flakes. The engine calls the app from its own threads, hence a
transactional database. The stateful phase follows the schema's links wherever they
lead (the operator API's too, refused to a member: 401). Sandboxes are the memory backend's (no
Docker), and turns are only enqueued (no Celery worker runs them).
"""

import time

import pytest
import schemathesis
from django.core.management import call_command
from django.core.wsgi import get_wsgi_application
from django.db import connections
from drf_spectacular.generators import SchemaGenerator
from schemathesis.engine import events, from_schema
from schemathesis.transport.wsgi import WSGITransport

from quor import services
from quor.lib import schema as quor_schema
from quor.models import ApiToken
from sandboxes.backends.memory import MemoryBackend
from sandboxes.models import Sandbox
from tests import factories

# The member's API: the runtime's endpoints take only a sandbox's credential, and the
# operator API only the operator token (its errors are documented the same way).
INCLUDED = r"^/api/v1/"
EXCLUDED = r"^/api/v1/runtime/"

MAX_EXAMPLES = 4
STATEFUL_EXAMPLES = 12  # chains: create, read, change, delete, read again
SEED = 20261204

# Values a JSON schema cannot tell valid: they name objects the member has (or not), or
# follow a syntax of their own. A schema-valid request may meet a 400 that says why;
# every other check still holds for these operations.
REFERENCES = {
    ("POST", "/api/v1/sessions/"): "`model`, `apps` and `skills` name the member's own",
    ("POST", "/api/v1/scheduled-tasks/"): "the same, and `cron` and `timezone` syntax",
    ("PATCH", "/api/v1/scheduled-tasks/{id}/"): "the same, and `cron` and `timezone` syntax",
    ("POST", "/api/v1/sessions/{session_id}/exec/"): "`env` names (no propertyNames in 3.0)",
    ("POST", "/api/v1/sessions/{id}/public-links/"): "`webapp` names the session's own app, "
    "`expires_at` at most QUOR_PUBLIC_LINK_MAX_DAYS away, a password for password links, "
    "email domains for email links only",
}
ACCEPTED_WITH_400 = ["2XX", "400", "401", "403", "404", "409", "429", "5XX"]
# The generator sends one Idempotency-Key with several bodies: a used key with another
# request is 422, as the IETF draft says.
IDEMPOTENT = {("POST", "/api/v1/sessions/{session_id}/exec/")}
ACCEPTED_WITH_422 = [*ACCEPTED_WITH_400, "422"]
# An empty upload goes without Content-Length in-process, which uploads need (411).
UPLOADS = {("POST", "/api/v1/sessions/{session_id}/files/content")}
ACCEPTED_WITH_411 = ["2XX", "401", "403", "404", "409", "411", "429", "5XX"]


def _lists(document) -> list[tuple[str, str]]:
    """The list operations: their `cursor` is opaque and signed (quor/lib/pagination.py),
    so a generated one is refused (400, `pagination.invalid_cursor`)."""
    return [
        (method.upper(), path)
        for path, operations in document["paths"].items()
        for method, operation in operations.items()
        if any(p["name"] == "cursor" for p in operation.get("parameters", []))
    ]


def _config(document) -> schemathesis.Config:
    accepted = {key: ACCEPTED_WITH_400 for key in [*REFERENCES, *_lists(document)]}
    accepted.update({key: ACCEPTED_WITH_411 for key in UPLOADS})
    accepted.update({key: ACCEPTED_WITH_422 for key in IDEMPOTENT})
    operations = [
        {
            "include-name": f"{method} {path}",
            "checks": {"positive_data_acceptance": {"expected-statuses": statuses}},
        }
        for (method, path), statuses in accepted.items()
    ]
    return schemathesis.Config.from_dict(
        {
            "seed": SEED,
            "workers": 1,
            "generation": {"max-examples": MAX_EXAMPLES, "deterministic": True},
            "phases": {
                # Methods an operation does not take, tried on every path: 405 each.
                "coverage": {"unexpected-methods": ["put", "patch", "delete", "trace"]},
                "stateful": {"generation": {"max-examples": STATEFUL_EXAMPLES}},
            },
            "operations": operations,
        }
    )


def _failures(schema) -> tuple[list[str], dict]:
    found = {}
    figures = {"operations": set(), "cases": 0, "phases": {}}
    errors = []
    for event in from_schema(schema).execute():
        if isinstance(event, events.ScenarioFinished):
            figures["operations"].add(event.recorder.label)
            figures["cases"] += len(event.recorder.cases)
            phase = event.phase.value
            figures["phases"][phase] = figures["phases"].get(phase, 0) + len(event.recorder.cases)
            for case_id, checks in event.recorder.checks.items():
                for check in checks:
                    if check.failure_info is None:
                        continue
                    case = event.recorder.cases[case_id].value
                    interaction = event.recorder.interactions.get(case_id)
                    answer = interaction.response if interaction else None
                    found.setdefault(
                        (check.name, case.operation.label),
                        f"{event.phase.value}: {case.method} {case.formatted_path} "
                        f"query={case.query!r} body={case.body!r} "
                        f"sent={interaction.request.body if interaction else None!r} -> "
                        f"{answer.status_code if answer else '?'} "
                        f"{(answer.content or b'')[:300] if answer else ''!r}\n"
                        f"{check.failure_info.failure}",
                    )
        elif isinstance(event, events.NonFatalError | events.FatalError):
            errors.append(repr(event))
    return errors + [f"{name} on {label}: {text}" for (name, label), text in found.items()], figures


@pytest.fixture
def in_process_transport(monkeypatch):
    """schemathesis 4.32.5 hands the in-process (WSGI) transport its network options
    when a check repeats a request (e.g. without credentials), which werkzeug refuses."""
    send = WSGITransport.send

    def without_network_options(self, case, **kwargs):
        for name in ("max_redirects", "verify", "cert", "proxies"):
            kwargs.pop(name, None)
        return send(self, case, **kwargs)

    monkeypatch.setattr(WSGITransport, "send", without_network_options)


@pytest.fixture
def memory_sandboxes(settings):
    """The memory backend (tests only): the member's sandbox starts, runs commands and
    keeps files as directories of this host, without Docker."""
    settings.DEBUG = True
    settings.QUOR_SANDBOX_BACKEND = "memory"
    yield
    MemoryBackend.reset()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("in_process_transport", "memory_sandboxes")
def test_the_api_answers_what_its_schema_documents(settings, monkeypatch):
    settings.QUOR_API_RATE_LIMIT_PER_TOKEN = 10**9
    settings.QUOR_API_RATE_LIMIT_PER_ORGANIZATION = 10**9
    # The engine's thread keeps its database connection from one request to the next:
    # connecting anew for each of ~2 800 requests was a quarter of the test's time.
    monkeypatch.setitem(connections.settings["default"], "CONN_MAX_AGE", None)
    org = factories.make_org()
    member = factories.make_user(org, email="member@acme.test")
    provider = factories.make_provider(org)
    factories.make_session(
        member, provider, sandbox=factories.make_sandbox(member, backend="memory")
    )

    document = SchemaGenerator().get_schema(request=None, public=True)
    schema = (
        schemathesis.openapi.from_wsgi(
            "/api/schema/", get_wsgi_application(), config=_config(document)
        )
        .include(path_regex=INCLUDED)
        .exclude(path_regex=EXCLUDED)
    )

    @schema.auth(refresh_interval=None)
    class MembersToken:
        """The member's token, and a new one when a generated DELETE revoked it."""

        token = (None, "")

        def get(self, case, context):
            pk, raw = MembersToken.token
            if not ApiToken.objects.filter(pk=pk, revoked_at__isnull=True).exists():
                token, raw = services.api_token_create(user=member, name="conformance")
                MembersToken.token = (token.pk, raw)
            return raw

        def set(self, case, data, context):
            case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}

    started = time.monotonic()
    failures, figures = _failures(schema)
    assert not Sandbox.objects.exclude(backend="memory").exists()  # Docker stayed out
    elapsed = time.monotonic() - started
    print(
        f"schemathesis: {len(figures['operations'])} operations and scenarios, "
        f"{figures['cases']} cases {figures['phases']}, {elapsed:.1f} s"
    )
    assert figures["phases"].get("stateful", 0) > 0  # links were found: the stateful phase ran
    assert failures == [], "\n\n".join(failures)


def test_the_schema_is_valid_and_documents_every_error():
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", "/dev/null")
    document = SchemaGenerator().get_schema(request=None, public=True)
    assert document["components"]["schemas"]["Error"] == quor_schema.ERROR_SCHEMA
    paths = document["paths"]
    for method, path in quor_schema.EXTRA_ERRORS:
        assert method.lower() in paths[path], (method, path)
    for path, operations in paths.items():
        if not path.startswith("/api/v1/") or path.startswith("/api/v1/runtime/"):
            continue
        for method, operation in operations.items():
            assert {"401", "403", "429"} <= set(operation["responses"]), (method, path)
