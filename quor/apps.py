from django.apps import AppConfig


class QuorConfig(AppConfig):
    name = "quor"
    verbose_name = "Quor"

    def ready(self):
        from quor import checks  # noqa: F401  (registers the system checks)
