from django.core.management.base import BaseCommand, CommandError

from sandboxes.backends.base import BackendError
from sandboxes.management.commands._helpers import require_the_workers_file_store
from sandboxes.runtime import services


class Command(BaseCommand):
    help = (
        "Compare the runtime instances and workspaces labelled with this deployment with "
        "the database, and repair what differs (the worker does this at start and every "
        "5 minutes). Prints what it found and did."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--dry-run", action="store_true", help="print what it would do, change nothing"
        )

    def handle(self, *args, dry_run, **options):
        require_the_workers_file_store()
        try:
            found = services.sandboxes_reconcile(dry_run=dry_run)
        except BackendError as exc:
            raise CommandError(str(exc)) from None
        prefix = "would do: " if dry_run else ""
        for action in found.actions:
            self.stdout.write(f"{prefix}{action}")
        if not found.actions:
            self.stdout.write("Nothing to repair: runtimes and database agree.")
