from django.core.management.base import BaseCommand, CommandError

from quor.lib.errors import QuorError
from sandboxes.management.commands._helpers import get_user_by_email
from sandboxes.runtime import services


class Command(BaseCommand):
    help = "Create or start a user's sandbox and wait until it runs; prints its id and state."

    def add_arguments(self, parser):
        parser.add_argument("email")

    def handle(self, *args, email, **options):
        try:
            sandbox = services.sandbox_ensure(user=get_user_by_email(email))
        except QuorError as exc:
            raise CommandError(exc.message) from None
        self.stdout.write(f"{sandbox.pk} {sandbox.state}")
