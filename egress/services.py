"""Writes of the egress app (the proxy's own decisions live in decisions.py)."""

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from egress.models import EgressDecision


def egress_decisions_delete_old() -> int:
    """Drops audit records past the retention period; safe to run any number of times."""
    cutoff = timezone.now() - timedelta(days=settings.QUOR_EGRESS_AUDIT_RETENTION_DAYS)
    deleted, _ = EgressDecision.objects.filter(created_at__lt=cutoff).delete()
    return deleted
