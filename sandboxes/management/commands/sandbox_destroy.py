from django.core.management.base import BaseCommand

from sandboxes.management.commands._helpers import get_sandbox_by_email
from sandboxes.runtime import services


class Command(BaseCommand):
    help = "Remove a user's sandbox container and (unless --keep-workspace) its workspace."

    def add_arguments(self, parser):
        parser.add_argument("email")
        parser.add_argument("--keep-workspace", action="store_true")

    def handle(self, *args, email, keep_workspace, **options):
        sandbox = get_sandbox_by_email(email)
        services.sandbox_destroy(
            sandbox=sandbox, remove_workspace=not keep_workspace, via="operator command"
        )
        self.stdout.write(f"{sandbox.pk} {sandbox.state}")
