from django.core.management.base import BaseCommand, CommandError

from quor import services
from quor.lib.errors import QuorError


class Command(BaseCommand):
    help = "Create an organization (a Quor workspace)."

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("--name", required=True)

    def handle(self, *args, slug, name, **options):
        try:
            organization = services.organization_create(slug=slug, name=name)
        except QuorError as exc:
            raise CommandError(exc.message) from None
        self.stdout.write(f"Created organization {organization.slug} ({organization.name}).")
