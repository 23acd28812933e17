"""Every change made in the admin goes to the audit log too, from Django's own record
of it (LogEntry: who, which object, which fields; the values are the services' to
record, and a secret's never)."""

from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.core.exceptions import ObjectDoesNotExist
from django.db.models.signals import post_save
from django.dispatch import receiver

from quor.audit import audit_record, organization_of

ADMIN_ACTIONS = {ADDITION: "admin.added", CHANGE: "admin.changed", DELETION: "admin.deleted"}


@receiver(post_save, sender=LogEntry)
def audit_admin_change(sender, instance: LogEntry, created, **kwargs):
    if not created:
        return
    try:
        target = instance.get_edited_object()  # a deleted object is still there
    except ObjectDoesNotExist:
        target = None
    audit_record(
        ADMIN_ACTIONS.get(instance.action_flag, "admin.changed"),
        target=target,
        organization=_organization_of_object(target) or organization_of(instance.user),
        actor=instance.user,
        changes={
            "object": f"{instance.content_type.app_label}.{instance.content_type.model} "
            f"{instance.object_id} {instance.object_repr}",
            "message": instance.get_change_message(),
        },
    )


def _organization_of_object(target):
    if target is None:
        return None
    if hasattr(target, "organization"):
        return target.organization
    return organization_of(target) if hasattr(target, "membership") else None
