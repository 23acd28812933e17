import time

from django.core.management.base import BaseCommand, CommandError

from quor.lib.errors import QuorError
from sandboxes.management.commands._helpers import get_sandbox_by_email
from sandboxes.runtime import services


class Command(BaseCommand):
    help = (
        "Put a user's sandbox to sleep now, idle or not: snapshot its workspace to the file "
        "store, then remove its runtime. Prints the snapshot."
    )

    def add_arguments(self, parser):
        parser.add_argument("email")

    def handle(self, *args, email, **options):
        sandbox = get_sandbox_by_email(email)
        started = time.monotonic()
        try:
            snapshot = services.sandbox_sleep(sandbox=sandbox, force=True)
        except QuorError as exc:
            raise CommandError(exc.message) from None
        sandbox.refresh_from_db()
        if snapshot is None:
            raise CommandError(f"Nothing to snapshot: the sandbox is {sandbox.state}.")
        self.stdout.write(
            f"{sandbox.pk} {sandbox.state}: snapshot {snapshot.pk}, {snapshot.size} bytes "
            f"({snapshot.workspace_bytes} uncompressed), sha256 {snapshot.sha256}, "
            f"{time.monotonic() - started:.1f} s"
        )
