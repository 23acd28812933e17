from django.core.management.base import BaseCommand, CommandError

from quor import services
from quor.models import User


class Command(BaseCommand):
    help = "Create a personal API token for a user and print it (shown once)."

    def add_arguments(self, parser):
        parser.add_argument("email")
        parser.add_argument("--name", default="created by create_api_token")

    def handle(self, *args, email, name, **options):
        user = User.objects.filter(email=email.strip().lower()).first()
        if user is None:
            raise CommandError(f"No user {email}.")
        _, raw_token = services.api_token_create(user=user, name=name)
        self.stdout.write(raw_token)
