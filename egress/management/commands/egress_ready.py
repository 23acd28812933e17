import sys

from django.core.management.base import BaseCommand

from egress import readiness


class Command(BaseCommand):
    help = "Exit 0 if the egress proxy is ready (has loaded the current sandboxes), 1 if not."

    def handle(self, *args, **options):
        state = readiness.readiness()
        if state is None:
            self.stdout.write("egress proxy: not ready")
            sys.exit(1)
        self.stdout.write(
            f"egress proxy: ready on {state['listen']}, {state['sandboxes']} sandboxes"
        )
