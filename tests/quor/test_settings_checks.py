import json
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.test import override_settings
from django.urls import get_resolver, resolve

from egress.decisions import API_ALIAS, Destination, upstream_host_header
from egress.directory import url_endpoint
from quor.checks import check_encryption_key
from sandboxes.api.authentication import SandboxCredentialAuthentication
from sandboxes.models import Sandbox, Session, hash_token
from tests import factories

pytestmark = pytest.mark.processes  # `manage.py` in processes of their own, started here

ROOT = Path(__file__).resolve().parents[2]


def error_ids(errors):
    return sorted(error.id for error in errors)


@pytest.mark.parametrize(
    ("debug", "key", "expected"),
    [
        (False, "", ["quor.E004"]),
        (False, "k" * 40, []),
        (True, "", []),
    ],
)
def test_the_encryption_key_is_required_outside_development(debug, key, expected):
    with override_settings(DEBUG=debug, QUOR_ENCRYPTION_KEY=key):
        assert error_ids(check_encryption_key(None)) == expected


def production_example() -> dict[str, str]:
    """The README's production configuration, each `<placeholder>` filled with a random
    value, so that the tests run what an operator copies."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("\n### Production\n") :]
    block = re.search(r"```sh\n(.*?)```", section, re.DOTALL).group(1)
    example = {}
    for line in block.splitlines():
        name, _, value = line.partition("#")[0].strip().partition("=")
        if name:
            example[name] = re.sub(r"<[^>]*>", lambda _: secrets.token_urlsafe(48), value)
    return example


PRODUCTION_ENV = production_example()


def run_manage(*args, env_changes, drop=()):
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUOR_") and k not in drop}
    env.update(env_changes)
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_documented_production_configuration_passes_check_deploy():
    result = run_manage("check", "--deploy", "--fail-level", "WARNING", env_changes=PRODUCTION_ENV)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_startup_fails_with_a_clear_message_without_an_encryption_key():
    env = {k: v for k, v in PRODUCTION_ENV.items() if k != "QUOR_ENCRYPTION_KEY"}
    result = run_manage("check", env_changes=env)
    assert result.returncode != 0
    assert "QUOR_ENCRYPTION_KEY is not set" in result.stderr


def test_the_retired_worker_token_is_neither_needed_nor_checked():
    assert "QUOR_WORKER_TOKEN" not in PRODUCTION_ENV
    assert not hasattr(settings, "QUOR_WORKER_TOKEN")
    # A deployment that still sets it (to anything) starts as before.
    result = run_manage("check", env_changes={**PRODUCTION_ENV, "QUOR_WORKER_TOKEN": "x"})
    assert result.returncode == 0, result.stdout + result.stderr


def test_startup_refuses_a_short_operator_token_and_accepts_none():
    result = run_manage("check", env_changes={**PRODUCTION_ENV, "QUOR_OPERATOR_TOKEN": "x" * 31})
    assert result.returncode != 0
    assert "quor.E011" in result.stderr
    assert "QUOR_OPERATOR_TOKEN" not in PRODUCTION_ENV  # optional: no operator API


def test_secrets_can_be_read_from_files(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("from-a-file-encryption-key\n")
    env = {k: v for k, v in PRODUCTION_ENV.items() if k != "QUOR_ENCRYPTION_KEY"}
    env["QUOR_ENCRYPTION_KEY_FILE"] = str(key_file)
    result = run_manage(
        "shell",
        "-c",
        "from django.conf import settings; print(settings.QUOR_ENCRYPTION_KEY)",
        env_changes=env,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "from-a-file-encryption-key"


def url_paths() -> set[str]:
    """One path (without its leading slash, as SecurityMiddleware matches it) for every
    URL pattern, each parameter filled with a value the pattern accepts."""
    paths = set()
    for _, entries in get_resolver().reverse_dict.lists():
        for possibilities, pattern, _, _ in entries:
            for template, params in possibilities:
                for value in ("1", "00000000-0000-4000-8000-000000000000"):
                    path = template % dict.fromkeys(params, value)
                    if re.search(pattern, path):
                        paths.add(path)
                        break
    return paths


def is_sandbox_facing(path: str) -> bool:
    """The view accepts the sandbox credential, which only the egress proxy sends."""
    view = getattr(resolve("/" + path).func, "cls", None)
    return SandboxCredentialAuthentication in getattr(view, "authentication_classes", ())


def test_only_the_sandbox_facing_api_is_exempt_from_the_https_redirect():
    exempt = [re.compile(pattern) for pattern in settings.SECURE_REDIRECT_EXEMPT]
    paths = url_paths()
    assert len(paths) > 30
    exempted = {path for path in paths if any(pattern.search(path) for pattern in exempt)}
    assert exempted == {path for path in paths if is_sandbox_facing(path)}
    # What the agent runtime calls (deploy/sandbox/runtime/agent.py).
    assert {"api/v1/runtime/sessions/1/events/", "api/v1/runtime/sessions/1/webapps/"} <= exempted


# Sent by `manage.py shell -c` in a process configured like production: (name, method,
# Host, path, extra headers) for each request, then each answer's status, Location and body.
REQUESTS_SCRIPT = """
import json
from django.test import Client

client = Client(enforce_csrf_checks=True, raise_request_exception=False)
answers = {}
for name, method, host, path, headers in json.loads(REQUESTS):
    response = client.generic(
        method, path, BODY, content_type="application/json", headers={"Host": host, **headers}
    )
    answers[name] = [response.status_code, response.get("Location"), response.content.decode()]
print(json.dumps(answers))
"""


@pytest.mark.django_db(transaction=True)
def test_the_egress_proxy_reaches_the_runtime_api_with_the_production_configuration(owner):
    session = factories.make_session(owner, status=Session.Status.RUNNING)
    Sandbox.objects.filter(pk=session.sandbox_id).update(
        runtime_credential_hash=hash_token("sandbox-credential")
    )
    # The Host the egress proxy sends for `http://quor-api`, over plain HTTP.
    api_host, api_port, _ = url_endpoint(PRODUCTION_ENV["QUOR_SANDBOX_API_URL"])
    proxy_host = upstream_host_header(Destination(api_host, api_port, (), requested=API_ALIAS))
    events = f"/api/v1/runtime/sessions/{session.pk}/events/"
    credential = {"Authorization": "Bearer sandbox-credential"}
    requests = [
        ("sandbox events", "POST", proxy_host, events, credential),
        ("sandbox, other API", "GET", proxy_host, "/api/v1/sessions/", credential),
        ("browser page", "GET", "quor.example.com", "/", {}),
        ("browser API", "GET", "quor.example.com", "/api/v1/sessions/", {}),
        ("browser, runtime API", "POST", "quor.example.com", events, {}),
        ("unknown host", "POST", "quor.evil.test", events, credential),
    ]
    body = {"events": [{"kind": "assistant_text", "payload": {"text": "hi"}}]}
    script = f"REQUESTS = {json.dumps(requests)!r}\nBODY = {json.dumps(body)!r}\n"
    env = {
        **PRODUCTION_ENV,
        # The example's other machines and secrets: the test database, Redis and key.
        "DATABASE_URL": f"postgresql:///{settings.DATABASES['default']['NAME']}",
        "REDIS_URL": os.environ["REDIS_URL"],
        "QUOR_ENCRYPTION_KEY": settings.QUOR_ENCRYPTION_KEY,
    }
    result = run_manage("shell", "-c", script + REQUESTS_SCRIPT, env_changes=env)
    assert result.returncode == 0, result.stdout + result.stderr
    answers = json.loads(result.stdout.strip().splitlines()[-1])

    # Neither refused by host validation nor redirected, CSRF not in the way: stored.
    assert answers["sandbox events"] == [200, None, '{"last_seq":1}'], result.stderr
    assert list(session.events.values_list("kind", flat=True)) == ["assistant_text"]
    # Only the sandbox-facing paths are exempt: the rest of the API, for the proxy too,
    # and every browser page still go to HTTPS.
    assert answers["sandbox, other API"][:2] == [301, f"https://{proxy_host}/api/v1/sessions/"]
    assert answers["browser page"][:2] == [301, "https://quor.example.com/"]
    assert answers["browser API"][:2] == [301, "https://quor.example.com/api/v1/sessions/"]
    # SECURE_REDIRECT_EXEMPT matches paths, not hosts: a browser on the runtime path is
    # not redirected, and gets nothing without the sandbox credential (no session login
    # is accepted there).
    assert answers["browser, runtime API"][0] == 401
    assert answers["unknown host"][0] == 400
