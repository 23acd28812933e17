import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from sandboxes.scripted_model import ScriptedModelServer, demo_script

DEMO_MODEL_PORT = 8090


class Command(BaseCommand):
    help = (
        "Development only: serve the scripted 'Demo (scripted)' model on 127.0.0.1:8090, "
        "so a session works without a model provider key. Refused outside QUOR_DEBUG."
    )

    def handle(self, *args, **options):
        if not settings.DEBUG:
            raise CommandError("The scripted demo model runs only in development (QUOR_DEBUG).")
        server = ScriptedModelServer("127.0.0.1", DEMO_MODEL_PORT)
        server.script = demo_script()
        self.stdout.write(f"Scripted demo model on http://127.0.0.1:{DEMO_MODEL_PORT}")
        self.stdout.flush()
        try:
            while True:
                time.sleep(3600)
        finally:
            server.close()
