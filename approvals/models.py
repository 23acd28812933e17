"""Requests parked by the egress proxy until the session owner decides, and the
"for this session" grants those decisions leave behind."""

import uuid

from django.conf import settings
from django.db import models


class ApprovalRequest(models.Model):
    """The truth about one parked request: the proxy forwards it with a credential only
    when this row says approved."""

    class Status(models.TextChoices):
        PENDING = "pending", "Waiting for the user"
        APPROVED = "approved", "Approved"
        REJECTED = "rejected", "Rejected"
        EXPIRED = "expired", "Expired"

    class DecidedVia(models.TextChoices):
        USER = "user", "The user, once"
        SESSION_GRANT = "session_grant", "The user, for the session"
        PROXY = "proxy", "The proxy (timeout, restart or lost signal)"
        CANCEL = "cancel", "The turn was cancelled"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    session = models.ForeignKey(
        "sandboxes.Session", on_delete=models.CASCADE, related_name="approval_requests"
    )
    app = models.ForeignKey(
        "integrations.App", on_delete=models.SET_NULL, null=True, related_name="+"
    )
    app_name = models.CharField(max_length=100)
    actions = models.JSONField(help_text="The matched actions, strictest first: key, name, policy.")
    method = models.CharField(max_length=16)
    url = models.TextField(verbose_name="URL", help_text="Query string values masked.")
    summary = models.CharField(max_length=300)
    body_preview = models.TextField(
        blank=True, help_text="The start of the request's body as text, for the user to read."
    )
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    decided_via = models.CharField(max_length=20, choices=DecidedVia.choices, blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["status", "expires_at"])]

    def __str__(self):
        return f"{self.method} {self.url} ({self.status})"

    @property
    def action_keys(self) -> list[str]:
        return [a["key"] for a in self.actions if a.get("policy") == "ask"]


class SessionGrant(models.Model):
    """ "Approve matching actions for this session": later requests of this App action
    in this session pass without asking."""

    session = models.ForeignKey(
        "sandboxes.Session", on_delete=models.CASCADE, related_name="app_grants"
    )
    app = models.ForeignKey("integrations.App", on_delete=models.CASCADE, related_name="+")
    action_key = models.CharField(max_length=100)
    approval = models.ForeignKey(ApprovalRequest, on_delete=models.SET_NULL, null=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["session", "app", "action_key"], name="session_grant_unique"
            )
        ]

    def __str__(self):
        return f"{self.app_id}:{self.action_key} in {self.session_id}"
