"""Writes to an organization's Apps: adding built-in and custom Apps, their actions'
policies and their credentials; and the access checks every entry point uses.

Every function takes keyword arguments, checks all of its input before it writes
anything, and raises a QuorError with an `apps.*` code (docs/errors.md) that the API,
the admin and the user page all report the same way. Credentials are write-only:
nothing here returns or logs a secret.
"""

import re
from dataclasses import dataclass

from django.db import IntegrityError, transaction

from apps import policy
from apps.catalog import CatalogApp, catalog_app
from apps.models import App, AppAction, AppCredential, Policy
from apps.selectors import apps_visible_to
from quor.audit import audit_record, field_changes, secret_change
from quor.lib.errors import Conflict, InvalidInput, NotFound
from quor.lib.ids import is_database_id
from quor.lib.permissions import Permission, require_permission
from quor.models import Membership

UNCHANGED = object()  # app_update: "leave this field as it is"

MAX_SECRET_CHARS = 8192
MAX_URL_PATTERNS = 20
_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,100}$")
# Headers the proxy owns or that change how the request is framed or routed.
_RESERVED_HEADERS = {
    "host",
    "connection",
    "content-length",
    "content-type",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "proxy-connection",
    "x-quor-session",
}


# --- checks shared with the admin forms ------------------------------------------------------


def clean_name(name, *, organization, exclude_pk=None) -> str:
    if not isinstance(name, str) or not name.strip():
        raise InvalidInput("An App needs a name.", code="apps.invalid_name")
    name = name.strip()
    if len(name) > App._meta.get_field("name").max_length:
        raise InvalidInput(
            "The name is too long (100 characters at most).", code="apps.invalid_name"
        )
    taken = App.objects.filter(organization=organization, name__iexact=name)
    if exclude_pk is not None:
        taken = taken.exclude(pk=exclude_pk)
    if taken.exists():
        raise Conflict(
            f"The organization already has an App named {name!r}.", code="apps.name_taken"
        )
    return name


def clean_url_patterns(url_patterns) -> list[str]:
    """Checked URL patterns in their canonical spelling, without duplicates."""
    if isinstance(url_patterns, str) or not isinstance(url_patterns, list | tuple):
        raise InvalidInput(
            "url_patterns is a list of URLs such as https://api.example.com.",
            code="apps.invalid_url_pattern",
        )
    cleaned = []
    for text in url_patterns:
        if not isinstance(text, str):
            raise InvalidInput("Every URL pattern is a string.", code="apps.invalid_url_pattern")
        try:
            cleaned.append(str(policy.parse_url_pattern(text)))
        except policy.InvalidPattern as exc:
            raise InvalidInput(str(exc), code="apps.invalid_url_pattern") from None
    cleaned = list(dict.fromkeys(cleaned))
    if not cleaned:
        raise InvalidInput(
            "An App needs at least one URL pattern.", code="apps.invalid_url_pattern"
        )
    if len(cleaned) > MAX_URL_PATTERNS:
        raise InvalidInput(
            f"At most {MAX_URL_PATTERNS} URL patterns per App.", code="apps.invalid_url_pattern"
        )
    return cleaned


def clean_credential_style(credential_style, credential_header="") -> tuple[str, str]:
    """(style, header name in lower case); the header is kept only for the header style."""
    if credential_style not in App.CredentialStyle.values:
        raise InvalidInput(
            f"Unknown credential style {credential_style!r} (bearer, basic or header).",
            code="apps.invalid_credential_style",
        )
    if credential_style != App.CredentialStyle.HEADER:
        return credential_style, ""
    header = (credential_header or "").strip().lower() if isinstance(credential_header, str) else ""
    if not _HEADER_NAME.match(header):
        raise InvalidInput(
            "The custom-header style needs a header name such as X-Api-Key.",
            code="apps.invalid_credential_header",
        )
    if header in _RESERVED_HEADERS or header.startswith("proxy-"):
        raise InvalidInput(
            f"{header!r} cannot carry a credential: the proxy or HTTP itself uses it.",
            code="apps.invalid_credential_header",
        )
    return credential_style, header


def clean_when_not_selected(value) -> str:
    if value not in App.WhenNotSelected.values:
        raise InvalidInput(
            f"Unknown value {value!r} for when_not_selected (forward or deny).",
            code="apps.invalid_when_not_selected",
        )
    return value


def clean_policy(value) -> str:
    if value not in Policy.values:
        raise InvalidInput(
            f"Unknown policy {value!r} (auto, ask or deny).", code="apps.invalid_policy"
        )
    return value


def clean_secret(secret, *, credential_style: str) -> str:
    """A credential that can go into one HTTP header as the App's style sends it."""
    if not isinstance(secret, str) or not secret.strip():
        raise InvalidInput("The credential is empty.", code="apps.invalid_secret")
    secret = secret.strip()
    if len(secret) > MAX_SECRET_CHARS:
        raise InvalidInput(
            f"The credential is longer than {MAX_SECRET_CHARS} characters.",
            code="apps.invalid_secret",
        )
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in secret):
        raise InvalidInput(
            "The credential must be one line without control characters.",
            code="apps.invalid_secret",
        )
    if any(c.isspace() for c in secret):
        # A token never has one, and a header value would carry it as is (for basic
        # auth, user:token has none either): a space means a bad copy and paste.
        raise InvalidInput(
            "The credential must not contain spaces: paste the token alone, in one piece.",
            code="apps.invalid_secret",
        )
    if credential_style == App.CredentialStyle.BASIC:
        user, sep, password = secret.partition(":")
        if not (user and sep and password):
            raise InvalidInput(
                "This App takes user:token (for Jira, your email and an API token).",
                code="apps.invalid_secret",
            )
    elif not secret.isascii():
        raise InvalidInput(
            "The credential must be plain ASCII (letters, digits and punctuation).",
            code="apps.invalid_secret",
        )
    return secret


def _catalog_entry(catalog_key) -> CatalogApp:
    entry = catalog_app(catalog_key) if isinstance(catalog_key, str) else None
    if entry is None:
        raise InvalidInput(
            f"There is no built-in App {catalog_key!r}.", code="apps.unknown_catalog_app"
        )
    return entry


def _save_new(app: App) -> App:
    """Saves a new App; a concurrent twin (same name or catalog key) is a 409."""
    try:
        with transaction.atomic():
            app.save()
    except IntegrityError:
        raise Conflict(
            f"The organization already has an App named {app.name!r}.",
            code="apps.exists" if app.catalog_key else "apps.name_taken",
        ) from None
    return app


# --- Apps ----------------------------------------------------------------------------------


@transaction.atomic
def app_enable_builtin(*, organization, catalog_key: str, url_patterns=None) -> App:
    """Adds a built-in App with every catalog action at its default policy.

    `url_patterns` replaces the catalog's (a Jira site, GitHub Enterprise)."""
    entry = _catalog_entry(catalog_key)
    if App.objects.filter(organization=organization, catalog_key=entry.key).exists():
        raise Conflict(f"{entry.name} is already added to the organization.", code="apps.exists")
    patterns = clean_url_patterns(
        list(entry.url_patterns) if url_patterns is None else url_patterns
    )
    name = clean_name(entry.name, organization=organization)
    app = _save_new(
        App(
            organization=organization,
            catalog_key=entry.key,
            name=name,
            description=entry.description,
            url_patterns=patterns,
            credential_style=entry.credential_style,
            credential_header=entry.credential_header,
        )
    )
    AppAction.objects.bulk_create(
        AppAction(
            app=app,
            key=action.key,
            name=action.name,
            description=action.description,
            methods=list(action.methods),
            paths=list(action.paths),
            policy=action.default_policy,
        )
        for action in entry.actions
    )
    audit_record(
        "app.added",
        target=app,
        changes={"catalog_key": app.catalog_key, "url_patterns": app.url_patterns},
    )
    return app


@dataclass(frozen=True)
class CatalogSync:
    added: tuple[str, ...]
    updated: tuple[str, ...]
    removed: tuple[str, ...]

    @property
    def changed(self) -> bool:
        return bool(self.added or self.updated or self.removed)


@transaction.atomic
def app_sync_catalog(*, app: App) -> CatalogSync:
    """Brings a built-in App's actions up to date with the catalog: new actions at
    their default policy, changed names, methods and paths, actions gone from the
    catalog removed. The organization's policies of existing actions are kept."""
    if app.is_custom:
        raise InvalidInput(
            "Only built-in Apps follow the catalog; a custom App has no actions.",
            code="apps.not_builtin",
        )
    entry = _catalog_entry(app.catalog_key)
    App.objects.select_for_update().get(pk=app.pk)  # one sync of this App at a time
    existing = {action.key: action for action in app.actions.all()}
    added, updated = [], []
    for item in entry.actions:
        fields = {
            "name": item.name,
            "description": item.description,
            "methods": list(item.methods),
            "paths": list(item.paths),
        }
        current = existing.get(item.key)
        if current is None:
            AppAction.objects.create(app=app, key=item.key, policy=item.default_policy, **fields)
            added.append(item.key)
        elif any(getattr(current, name) != value for name, value in fields.items()):
            for name, value in fields.items():
                setattr(current, name, value)
            current.save(update_fields=[*fields, "updated_at"])
            updated.append(item.key)
    removed = sorted(set(existing) - {item.key for item in entry.actions})
    app.actions.filter(key__in=removed).delete()
    result = CatalogSync(tuple(added), tuple(updated), tuple(removed))
    if result.changed:
        audit_record(
            "app.catalog_synced",
            target=app,
            changes={"added": added, "updated": updated, "removed": removed},
        )
    return result


@transaction.atomic
def app_create_custom(
    *,
    organization,
    name: str,
    url_patterns,
    credential_style: str = App.CredentialStyle.BEARER,
    credential_header: str = "",
    description: str = "",
    when_not_selected: str = App.WhenNotSelected.FORWARD,
    enabled: bool = True,
) -> App:
    """A custom App: no cataloged actions, so every request to it is Ask (unless the
    admin denies its use entirely by disabling it)."""
    patterns = clean_url_patterns(url_patterns)
    style, header = clean_credential_style(credential_style, credential_header)
    when_not_selected = clean_when_not_selected(when_not_selected)
    name = clean_name(name, organization=organization)
    app = _save_new(
        App(
            organization=organization,
            name=name,
            description=(description or "").strip(),
            enabled=bool(enabled),
            url_patterns=patterns,
            credential_style=style,
            credential_header=header,
            when_not_selected=when_not_selected,
        )
    )
    audit_record(
        "app.added",
        target=app,
        changes={"url_patterns": patterns, "enabled": app.enabled, "custom": True},
    )
    return app


@transaction.atomic
def app_update(
    *,
    app: App,
    name=UNCHANGED,
    description=UNCHANGED,
    enabled=UNCHANGED,
    url_patterns=UNCHANGED,
    credential_style=UNCHANGED,
    credential_header=UNCHANGED,
    when_not_selected=UNCHANGED,
) -> App:
    """Changes the given fields, all checked before any is written."""
    changes = {}
    if name is not UNCHANGED:
        changes["name"] = clean_name(name, organization=app.organization, exclude_pk=app.pk)
    if description is not UNCHANGED:
        if not isinstance(description, str):
            raise InvalidInput("The description is text.", code="apps.invalid_description")
        changes["description"] = description.strip()
    if enabled is not UNCHANGED:
        changes["enabled"] = bool(enabled)
    if url_patterns is not UNCHANGED:
        changes["url_patterns"] = clean_url_patterns(url_patterns)
    if credential_style is not UNCHANGED or credential_header is not UNCHANGED:
        style = app.credential_style if credential_style is UNCHANGED else credential_style
        header = app.credential_header if credential_header is UNCHANGED else credential_header
        changes["credential_style"], changes["credential_header"] = clean_credential_style(
            style, header
        )
    if when_not_selected is not UNCHANGED:
        changes["when_not_selected"] = clean_when_not_selected(when_not_selected)
    before = {field: getattr(app, field) for field in changes}
    if before == changes:
        return app
    for field, value in changes.items():
        setattr(app, field, value)
    try:
        with transaction.atomic():
            app.save(update_fields=[*changes, "updated_at"])
    except IntegrityError:
        raise Conflict(
            f"The organization already has an App named {app.name!r}.", code="apps.name_taken"
        ) from None
    audit_record("app.changed", target=app, changes=field_changes(before, changes))
    return app


def app_set_action_policy(*, app: App, key: str, policy: str) -> AppAction:
    policy = clean_policy(policy)
    action = app.actions.filter(key=key).first() if isinstance(key, str) else None
    if action is None:
        raise NotFound(f"{app.name} has no action {key!r}.", code="apps.unknown_action")
    if action.policy != policy:
        audit_record("app.policy_changed", target=app, changes={key: [action.policy, policy]})
        action.policy = policy
        action.save(update_fields=["policy", "updated_at"])
    return action


# --- credentials ---------------------------------------------------------------------------


def _check_member(app: App, user) -> None:
    if (
        user is not None
        and not Membership.objects.filter(user=user, organization_id=app.organization_id).exists()
    ):
        raise InvalidInput(
            "Only members of the App's organization can have a credential for it.",
            code="apps.foreign_user",
        )


def app_credential_set(*, app: App, user=None, secret: str) -> AppCredential:
    """Stores (or replaces) the organization's credential (user None) or the user's own."""
    _check_member(app, user)
    secret = clean_secret(secret, credential_style=app.credential_style)
    credential, created = AppCredential.objects.update_or_create(
        app=app, user=user, defaults={"secret": secret}
    )
    _audit_credential(app, user, secret_change(not created, True))
    return credential


def app_credential_clear(*, app: App, user=None) -> bool:
    """Removes the credential; whether there was one. Clearing twice is harmless."""
    deleted, _ = AppCredential.objects.filter(app=app, user=user).delete()
    if deleted:
        _audit_credential(app, user, "removed")
    return deleted > 0


def _audit_credential(app: App, user, change: str) -> None:
    """Whose credential and what happened to it, never its value."""
    scope = "organization" if user is None else f"user {user.email}"
    audit_record("app.credential_" + change, target=app, changes={"credential": scope})


# --- access: the one way every entry point loads Apps for a user ----------------------------


def get_app_for_member(user, app_id) -> App:
    """An App the user may see and use; any other (another organization's, a disabled
    one for a non-admin, an unknown id) is 404."""
    app = apps_visible_to(user).filter(pk=app_id).first() if is_database_id(app_id) else None
    if app is None:
        raise NotFound("No such App.")
    return app


def get_app_for_admin(user, app_id) -> App:
    """An App of the admin's own organization (403 for members, 404 for others')."""
    membership = require_permission(user, Permission.ORGANIZATION_MANAGE)
    app = (
        App.objects.filter(organization=membership.organization, pk=app_id).first()
        if is_database_id(app_id)
        else None
    )
    if app is None:
        raise NotFound("No such App.")
    return app
