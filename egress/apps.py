from django.apps import AppConfig


class EgressConfig(AppConfig):
    name = "egress"
    verbose_name = "Egress"
