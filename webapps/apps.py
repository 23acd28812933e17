from django.apps import AppConfig


class WebappsConfig(AppConfig):
    name = "webapps"
    verbose_name = "Web apps"

    def ready(self):
        from webapps import receivers

        receivers.connect()
