from django.apps import AppConfig


class QuorAppsConfig(AppConfig):
    """Third-party Apps, their actions and policies. Labelled `integrations` so it is
    not confused with `django.apps.apps` or a migration's `apps` argument."""

    name = "apps"
    label = "integrations"
    verbose_name = "Apps"

    def ready(self):
        from apps import receivers

        receivers.connect()
