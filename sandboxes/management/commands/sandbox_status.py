from django.core.management.base import BaseCommand

from sandboxes.management.commands._helpers import get_user_by_email
from sandboxes.models import Sandbox
from sandboxes.runtime import services


class Command(BaseCommand):
    help = "Show sandboxes (all, or one user's) as recorded and as the runtime reports them."

    def add_arguments(self, parser):
        parser.add_argument("email", nargs="?")

    def handle(self, *args, email, **options):
        sandboxes = Sandbox.objects.select_related("user").order_by("user__email")
        if email:
            sandboxes = sandboxes.filter(user=get_user_by_email(email))
        for sandbox in sandboxes:
            sandbox = services.sandbox_refresh_state(sandbox)
            reason = f"  ({sandbox.failure_reason})" if sandbox.failure_reason else ""
            self.stdout.write(
                f"{sandbox.user.email}  {sandbox.pk}  {sandbox.state}  "
                f"image={sandbox.image_ref[:19] or '-'}  policy={sandbox.network_policy}{reason}"
            )
        if not sandboxes:
            self.stdout.write("No sandboxes.")
