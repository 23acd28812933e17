"""Plain factory functions for test data, each with sensible defaults."""

import functools
import itertools

from django.contrib.auth.hashers import make_password
from django.utils import timezone

from apps.models import App, AppAction, AppCredential
from quor import services
from quor.filestore import blob_put
from quor.models import EmailDomain, Membership, ModelProvider, Organization
from sandboxes.models import AgentEvent, Attachment, Sandbox, Session
from tests.environment import PORTS

_counter = itertools.count(1)

PASSWORD = "correct-horse-battery-staple"


def make_org(**fields) -> Organization:
    number = next(_counter)
    fields.setdefault("slug", f"org-{number}")
    fields.setdefault("name", f"Organization {number}")
    return Organization.objects.create(**fields)


def make_user(organization=None, *, role=Membership.Role.MEMBER, can_use_sandbox=True, email=None):
    organization = organization or make_org()
    email = email or f"user{next(_counter)}@example.com"
    user = services.member_create(
        email=email, organization=organization, role=role, can_use_sandbox=can_use_sandbox
    )
    user.password = _password_hash()
    user.save(update_fields=["password"])
    return user


@functools.cache
def _password_hash() -> str:
    """PASSWORD hashed once for every user of the run: each hash takes PBKDF2 half a
    second, and hundreds of tests make users. A real hash, so that every Quor process the
    tests start accepts the password."""
    return make_password(PASSWORD)


def make_verified_domain(organization, domain: str) -> EmailDomain:
    """An email domain the organization holds, as if its DNS record had been checked."""
    return EmailDomain.objects.create(
        organization=organization, domain=domain, token="t" * 32, verified_at=timezone.now()
    )


def make_provider(organization, **fields) -> ModelProvider:
    fields.setdefault("kind", ModelProvider.Kind.ANTHROPIC)
    fields.setdefault("display_name", f"Provider {next(_counter)}")
    fields.setdefault("api_key", f"sk-test-secret-{next(_counter)}-do-not-leak")
    fields.setdefault("model_names", ["claude-test"])
    return services.model_provider_create(organization=organization, **fields)


def make_sandbox(user, **fields) -> Sandbox:
    return Sandbox.objects.create(user=user, **fields)


def make_session(user, provider=None, **fields) -> Session:
    provider = provider or make_provider(user.membership.organization)
    sandbox = (
        fields.pop("sandbox", None)
        or Sandbox.objects.filter(user=user).first()
        or make_sandbox(user)
    )
    fields.setdefault("model_name", provider.model_names[0])
    return Session.objects.create(owner=user, sandbox=sandbox, model_provider=provider, **fields)


def make_event(session, seq, kind="assistant_text", **payload) -> AgentEvent:
    return AgentEvent.objects.create(session=session, seq=seq, kind=kind, payload=payload)


def make_attachment(session, name="notes.txt", content=b"some notes\n") -> Attachment:
    return Attachment.objects.create(session=session, name=name, blob=blob_put(content))


def make_app(organization, *, actions=(), credential=None, **fields) -> App:
    """An enabled App; `actions` are (key, method, path, policy) tuples."""
    fields.setdefault("name", f"App {next(_counter)}")
    fields.setdefault("url_patterns", [f"https://apps.test:{PORTS.TLS_APP}"])
    app = App.objects.create(organization=organization, **fields)
    for key, method, path, policy in actions:
        AppAction.objects.create(
            app=app,
            key=key,
            name=key.replace(".", " ").capitalize(),
            methods=[method],
            paths=[path],
            policy=policy,
        )
    if credential:
        AppCredential.objects.create(app=app, secret=credential)
    return app
