"""Web apps that agents run in their sessions, served by Quor on their own origins."""

import secrets
import uuid

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models

from quor.models import Organization
from sandboxes.models import Session


def new_label() -> str:
    """The app's host label: `<label>.<base domain>`. Random, so that app origins say
    nothing about sessions and cannot be guessed."""
    return "w" + secrets.token_hex(8)


class WebApp(models.Model):
    class Status(models.TextChoices):
        RUNNING = "running", "Running"
        STOPPED = "stopped", "Stopped"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    session = models.ForeignKey(
        "sandboxes.Session", on_delete=models.CASCADE, related_name="webapps"
    )
    label = models.CharField(max_length=32, unique=True, default=new_label, editable=False)
    port = models.PositiveIntegerField()
    command = models.TextField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.RUNNING)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["session", "port"]
        constraints = [
            models.UniqueConstraint(fields=["session", "port"], name="webapp_port_per_session")
        ]

    def __str__(self):
        return f"{self.label} (port {self.port})"


def new_link_label() -> str:
    """A public link's host label: `<label>.<base domain>`, an origin of its own (never
    Quor's, never the app's private one). 128 random bits: the link is its own secret."""
    return "p" + secrets.token_hex(16)


class PublicLink(models.Model):
    """A link that lets people outside Quor open one web app until it expires or is
    revoked, within its quotas (webapps/services.py, webapps/proxy.py)."""

    class VisitorAuth(models.TextChoices):
        NONE = "none", "Anyone with the link"
        PASSWORD = "password", "A password"
        EMAIL = "email", "An email address of allowed domains"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    webapp = models.ForeignKey(WebApp, on_delete=models.CASCADE, related_name="public_links")
    label = models.CharField(max_length=40, unique=True, default=new_link_label, editable=False)
    visitor_auth = models.CharField(
        max_length=10, choices=VisitorAuth.choices, default=VisitorAuth.NONE
    )
    password_hash = models.CharField(max_length=200, blank=True)
    email_domains = ArrayField(
        models.CharField(max_length=253),
        default=list,
        blank=True,
        help_text="For email links: the domains whose addresses get a one-time code.",
    )
    requests_per_minute = models.PositiveIntegerField()
    bandwidth_bytes = models.PositiveBigIntegerField(
        help_text="Bytes the link may serve to visitors over its whole life."
    )
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="public_links"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self):
        return f"public link {self.label} to {self.webapp.label}"


class PublicLinkVisit(models.Model):
    """A visitor opened a link (the first request of a browser, a password or an email's
    one-time code accepted): who opened what, for the audit."""

    link = models.ForeignKey(PublicLink, on_delete=models.CASCADE, related_name="visits")
    opened_at = models.DateTimeField(auto_now_add=True)
    address = models.GenericIPAddressField(null=True)
    user_agent = models.CharField(max_length=300, blank=True)
    authenticated_by = models.CharField(max_length=10, blank=True)
    email = models.EmailField(blank=True, help_text="The address an email link's code went to.")

    class Meta:
        ordering = ["-opened_at"]

    def __str__(self):
        return f"visit of {self.link_id} at {self.opened_at:%Y-%m-%d %H:%M:%S}"


class PublicLinkPolicy(Organization):
    """The organization's public link switch, as its admins see it in the admin site."""

    class Meta:
        proxy = True
        verbose_name = "public link policy"
        verbose_name_plural = "public link policy"


class SessionConfidentiality(Session):
    """A session as its organization's admins mark it confidential (no public links)."""

    class Meta:
        proxy = True
        verbose_name = "session confidentiality"
        verbose_name_plural = "session confidentiality"


def new_tunnel_label() -> str:
    """A relay tunnel's host label: `<label>.<base domain>`. 128 random bits: nobody
    finds a tunnel by guessing its host."""
    return "t" + secrets.token_hex(16)


class Tunnel(models.Model):
    """A local relay tunnel: a `quor tunnel PORT` client's outbound WebSocket, whose
    exact host the web app proxy relays to that client's loopback port while it is
    connected, until its hard TTL (webapps/tunnels.py)."""

    Sharing = Session.Sharing  # shared as a web app is, with the same words

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="tunnels"
    )
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+")
    label = models.CharField(max_length=40, unique=True, default=new_tunnel_label, editable=False)
    port = models.PositiveIntegerField(help_text="The loopback port the client relays to.")
    sharing = models.CharField(max_length=20, choices=Sharing.choices, default=Sharing.PRIVATE)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    closed_at = models.DateTimeField(null=True, blank=True)
    close_reason = models.CharField(max_length=20, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(
                fields=["owner"], condition=models.Q(closed_at=None), name="tunnel_open_owner"
            )
        ]

    def __str__(self):
        return f"tunnel {self.label} to port {self.port}"
