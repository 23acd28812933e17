from django.core.management.base import BaseCommand, CommandError

from sandboxes import services
from sandboxes.management.commands._helpers import get_user_by_email
from sandboxes.models import Sandbox


class Command(BaseCommand):
    help = "Remove a user's sandbox container and (unless --keep-workspace) its workspace."

    def add_arguments(self, parser):
        parser.add_argument("email")
        parser.add_argument("--keep-workspace", action="store_true")

    def handle(self, *args, email, keep_workspace, **options):
        sandbox = Sandbox.objects.filter(user=get_user_by_email(email)).first()
        if sandbox is None:
            raise CommandError(f"{email} has no sandbox.")
        services.sandbox_destroy(sandbox=sandbox, remove_workspace=not keep_workspace)
        self.stdout.write(f"{sandbox.pk} {sandbox.state}")
