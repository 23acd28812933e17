"""Organizations' domain rules and the audit record of every egress decision."""

from django.db import models


class EgressDomainRule(models.Model):
    """An organization's allow or deny entry for destination domains, in every mode.

    A deny entry always blocks. When an organization has allow entries, its
    sandboxes reach only those (besides the Quor API and model providers)."""

    class Action(models.TextChoices):
        ALLOW = "allow", "Allow"
        DENY = "deny", "Deny"

    organization = models.ForeignKey(
        "quor.Organization", on_delete=models.CASCADE, related_name="egress_rules"
    )
    pattern = models.CharField(
        max_length=253, help_text="A domain (example.com) or a wildcard (*.example.com)."
    )
    action = models.CharField(max_length=5, choices=Action.choices)
    note = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["organization", "action", "pattern"]
        constraints = [
            models.UniqueConstraint(
                fields=["organization", "pattern", "action"], name="egress_rule_unique"
            )
        ]

    def __str__(self):
        return f"{self.action} {self.pattern}"


class EgressDecision(models.Model):
    """One decision of the egress proxy, without secrets (query strings masked)."""

    class Outcome(models.TextChoices):
        TUNNELED = "tunneled", "Tunneled (HTTPS, untouched)"
        FORWARDED = "forwarded", "Forwarded"
        INJECTED = "injected", "Forwarded with a credential"
        BLOCKED = "blocked", "Blocked"

    created_at = models.DateTimeField(db_index=True)
    # Plain ids, not foreign keys: the audit trail outlives sandboxes and sessions.
    sandbox_id = models.UUIDField(null=True, blank=True, db_index=True)
    session_id = models.UUIDField(null=True, blank=True, db_index=True)
    client_address = models.GenericIPAddressField(null=True, blank=True)
    method = models.CharField(max_length=16)
    host = models.CharField(max_length=253)
    port = models.PositiveIntegerField(null=True, blank=True)
    path = models.TextField(blank=True, help_text="Query string values masked.")
    outcome = models.CharField(max_length=10, choices=Outcome.choices)
    code = models.CharField(max_length=64, blank=True, help_text="Refusal code, if blocked.")
    reason = models.TextField(blank=True)
    addresses = models.JSONField(default=list, blank=True)
    credential_kind = models.CharField(max_length=32, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self):
        return f"{self.outcome} {self.method} {self.host}"
