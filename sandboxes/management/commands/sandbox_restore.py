import time

from django.core.management.base import BaseCommand, CommandError

from quor.lib.errors import QuorError
from sandboxes.management.commands._helpers import get_sandbox_by_email
from sandboxes.models import Sandbox
from sandboxes.runtime import services
from sandboxes.runtime.snapshots import good_snapshots


class Command(BaseCommand):
    help = (
        "Wake a user's sleeping sandbox now: a new runtime with its newest good snapshot "
        "(an older one if that is damaged), Skills, Library and web apps."
    )

    def add_arguments(self, parser):
        parser.add_argument("email")

    def handle(self, *args, email, **options):
        sandbox = get_sandbox_by_email(email)
        if sandbox.state not in (Sandbox.State.SLEEPING, Sandbox.State.RESTORING):
            raise CommandError(f"The sandbox is {sandbox.state}, not sleeping.")
        started = time.monotonic()
        try:
            sandbox = services.sandbox_ensure_running(sandbox)
        except QuorError as exc:
            raise CommandError(exc.message) from None
        snapshot = good_snapshots(sandbox).first()
        notes = f"  ({sandbox.failure_reason})" if sandbox.failure_reason else ""
        self.stdout.write(
            f"{sandbox.pk} {sandbox.state}: from snapshot {snapshot.pk} of "
            f"{snapshot.created_at:%Y-%m-%d %H:%M:%S}, {time.monotonic() - started:.1f} s{notes}"
        )
