"""An organization's Apps (built-in from the catalog, or custom), their actions'
policies and their credentials."""

from django.conf import settings
from django.db import models

from quor.lib.fields import EncryptedTextField


class Policy(models.TextChoices):
    AUTO = "auto", "Auto-approve"
    ASK = "ask", "Ask"
    DENY = "deny", "Deny"


class App(models.Model):
    """A third-party service that sandboxes reach through the egress proxy.

    A built-in App (`catalog_key` set) gets its URL patterns and actions from the
    catalog (`apps/catalog/`); its URL patterns may be changed (GitHub Enterprise,
    a Jira site). A custom App has no actions: every request to it is Ask."""

    class CredentialStyle(models.TextChoices):
        BEARER = "bearer", "Authorization: Bearer <token>"
        BASIC = "basic", "Authorization: Basic (user:token)"
        HEADER = "header", "A custom header"

    class WhenNotSelected(models.TextChoices):
        FORWARD = "forward", "Forward without the credential"
        DENY = "deny", "Deny"

    organization = models.ForeignKey(
        "quor.Organization", on_delete=models.CASCADE, related_name="apps"
    )
    catalog_key = models.CharField(
        max_length=50, blank=True, help_text="The built-in App this is; empty for a custom App."
    )
    name = models.CharField(max_length=100)
    description = models.TextField(blank=True)
    enabled = models.BooleanField(default=True)
    url_patterns = models.JSONField(
        default=list,
        help_text="One per line in forms: https://host[:port][/base/path]; the host may "
        "be *.domain.",
    )
    credential_style = models.CharField(
        max_length=10, choices=CredentialStyle.choices, default=CredentialStyle.BEARER
    )
    credential_header = models.CharField(
        max_length=100, blank=True, help_text="The header name, for the custom-header style."
    )
    when_not_selected = models.CharField(
        max_length=10,
        choices=WhenNotSelected.choices,
        default=WhenNotSelected.FORWARD,
        help_text="What happens to a request to this App from a session that did not select it.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["organization", "name"]
        constraints = [
            models.UniqueConstraint(fields=["organization", "name"], name="app_name_unique"),
            models.UniqueConstraint(
                fields=["organization", "catalog_key"],
                condition=~models.Q(catalog_key=""),
                name="app_catalog_key_unique",
            ),
        ]

    def __str__(self):
        return self.name

    @property
    def is_custom(self) -> bool:
        return not self.catalog_key


class AppAction(models.Model):
    """One cataloged action of a built-in App and the organization's policy for it."""

    app = models.ForeignKey(App, on_delete=models.CASCADE, related_name="actions")
    key = models.CharField(max_length=100)
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    methods = models.JSONField(default=list)
    paths = models.JSONField(default=list)
    policy = models.CharField(max_length=4, choices=Policy.choices)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["app", "key"]
        constraints = [models.UniqueConstraint(fields=["app", "key"], name="app_action_key_unique")]

    def __str__(self):
        return f"{self.app}: {self.name}"


class AppCredential(models.Model):
    """An App's token: the organization's (user empty) or one user's own. Write-only:
    only the egress proxy reads it, to inject it into an allowed request."""

    app = models.ForeignKey(App, on_delete=models.CASCADE, related_name="credentials")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="app_credentials",
    )
    secret = EncryptedTextField()
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["app", "user"], name="app_credential_user_unique"),
            models.UniqueConstraint(
                fields=["app"], condition=models.Q(user=None), name="app_credential_org_unique"
            ),
        ]

    def __str__(self):
        return f"{self.app} ({self.user or 'organization'})"
