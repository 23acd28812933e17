from django.apps import AppConfig


class SandboxesConfig(AppConfig):
    name = "sandboxes"
    verbose_name = "Sandboxes"

    def ready(self):
        from sandboxes import receivers

        receivers.connect()
