"""Web apps that agents run in their sessions, served by Quor on their own origins."""

import secrets
import uuid

from django.db import models


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
