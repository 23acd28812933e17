from django.apps import AppConfig
from django.contrib.admin.apps import AdminConfig


class QuorConfig(AppConfig):
    name = "quor"
    verbose_name = "Quor"

    def ready(self):
        from quor import checks  # noqa: F401  (registers the system checks)


class QuorAdminConfig(AdminConfig):
    default_site = "quor.admin_site.QuorAdminSite"
