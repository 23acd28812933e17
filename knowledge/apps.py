from django.apps import AppConfig


class KnowledgeConfig(AppConfig):
    """Company knowledge: sources, documents with access lists, and the permission-aware
    search that users and sandboxes reach through the Quor API."""

    name = "knowledge"
    verbose_name = "Company knowledge"

    def ready(self):
        from knowledge import checks  # noqa: F401  (registers the system checks)
