from django.apps import AppConfig
from django.contrib.admin.apps import AdminConfig


class QuorConfig(AppConfig):
    name = "quor"
    verbose_name = "Quor"

    def ready(self):
        from quor import checks, receivers  # noqa: F401  (register the checks, receivers)


class QuorAdminConfig(AdminConfig):
    default_site = "quor.admin_site.QuorAdminSite"
