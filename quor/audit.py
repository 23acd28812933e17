"""The audit log: every administrative and security-relevant change, written in the
same transaction as the change (so one is never kept without the other), with the
actor and request that made it.

The actor is whoever the entry point authenticated (`logs.acting_as`): the API's
permission check, a page's, the admin site's. Tasks act as "system". A secret is never
written: `secret_change` says whether it was set, replaced or removed.
"""

import json
from collections.abc import Iterator
from datetime import timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from quor.lib import logs
from quor.lib.errors import InvalidInput
from quor.models import AuditEntry, Organization, User


def audit_record(
    action: str, *, target=None, organization=None, changes=None, actor=None
) -> AuditEntry:
    actor = actor if actor is not None else logs.actor.get()
    if organization is None and isinstance(target, Organization):
        organization = target
    if organization is None:
        organization = getattr(target, "organization", None) or organization_of(actor)
    return AuditEntry.objects.create(
        organization=organization,
        actor=actor if isinstance(actor, User) else None,
        actor_label=actor.email if actor is not None else "system",
        action=action,
        target_type=target._meta.label_lower if isinstance(target, models.Model) else "",
        target_id=str(target.pk) if isinstance(target, models.Model) else "",
        target_label=str(target)[:200] if target is not None else "",
        changes=changes or {},
        request_id=logs.request_id.get() or logs.task_id.get(),
    )


def organization_of(user):
    membership = getattr(user, "membership", None) if user is not None else None
    return membership.organization if membership is not None else None


def field_changes(before: dict, after: dict) -> dict:
    """{field: [before, after]} for the fields whose value differs."""
    return {
        name: [_plain(before.get(name)), _plain(value)]
        for name, value in after.items()
        if before.get(name) != value
    }


def secret_change(had_one: bool, has_one: bool) -> str:
    if has_one:
        return "replaced" if had_one else "set"
    return "removed" if had_one else "unchanged"


def _plain(value):
    """A value JSON can hold: model instances and querysets by their str."""
    if isinstance(value, models.Model):
        return str(value)
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, set | frozenset | models.QuerySet):
        return sorted(_plain(item) for item in value)
    return value


def audit_entries_delete_old() -> int:
    cutoff = timezone.now() - timedelta(days=settings.QUOR_AUDIT_RETENTION_DAYS)
    deleted, _ = AuditEntry.objects.filter(created_at__lt=cutoff).delete()
    return deleted


def _time(name: str, value: str | None):
    if not value:
        return None
    parsed = parse_datetime(value)
    if parsed is None or parsed.tzinfo is None:
        raise InvalidInput(
            f"{name} must be an ISO 8601 time with its offset, e.g. 2026-12-01T00:00:00Z.",
            code="audit.invalid_time",
        )
    return parsed


def audit_entries_filtered(*, organization=None, since=None, until=None, action=None):
    entries = AuditEntry.objects.select_related("organization").order_by("created_at", "id")
    if organization is not None:
        entries = entries.filter(organization=organization)
    if (since := _time("since", since)) is not None:
        entries = entries.filter(created_at__gte=since)
    if (until := _time("until", until)) is not None:
        entries = entries.filter(created_at__lt=until)
    if action:
        entries = entries.filter(action=action)
    return entries


def audit_entries_as_json_lines(entries) -> Iterator[bytes]:
    """One JSON object per entry and line; read in batches, so an export of any size
    holds one batch in memory."""
    for entry in entries.iterator(chunk_size=500):
        record = {
            "id": entry.pk,
            "created_at": entry.created_at.isoformat(),
            "organization": entry.organization.slug if entry.organization else None,
            "actor": entry.actor_label,
            "action": entry.action,
            "target": {"type": entry.target_type, "id": entry.target_id,
                       "label": entry.target_label},
            "changes": entry.changes,
            "request_id": entry.request_id,
        }  # fmt: skip
        yield (json.dumps(record, default=str) + "\n").encode()
