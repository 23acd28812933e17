from django.core.management.base import BaseCommand, CommandError

from quor.lib.errors import QuorError
from sandboxes.management.commands._helpers import get_sandbox_by_email
from sandboxes.runtime import services


class Command(BaseCommand):
    help = (
        "For a sandbox whose workspace cannot be restored: let its next start give an empty "
        "workspace (recorded as a workspace reset). Needs --yes: the earlier files are gone."
    )

    def add_arguments(self, parser):
        parser.add_argument("email")
        parser.add_argument(
            "--yes", action="store_true", help="confirm that the earlier files are gone"
        )

    def handle(self, *args, email, yes, **options):
        sandbox = get_sandbox_by_email(email)
        if not yes:
            raise CommandError(
                f"The sandbox is {sandbox.state}: {sandbox.failure_reason or 'no failure'}. "
                "Run again with --yes to start it with an empty workspace."
            )
        try:
            services.sandbox_start_empty(sandbox=sandbox, via="operator command")
        except QuorError as exc:
            raise CommandError(f"{exc.code}: {exc.message}") from None
        sandbox.refresh_from_db()
        self.stdout.write(f"{sandbox.pk} {sandbox.state}: the next start has an empty workspace")
