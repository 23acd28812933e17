import os

from django.core.management.base import BaseCommand, CommandError

from quor import services
from quor.lib.errors import QuorError
from quor.models import Membership, Organization


class Command(BaseCommand):
    help = (
        "Create a user in an organization. The password comes from QUOR_NEW_PASSWORD, "
        "or a generated one is printed once."
    )

    def add_arguments(self, parser):
        parser.add_argument("email")
        parser.add_argument("--org", required=True, help="Organization slug.")
        parser.add_argument(
            "--role", choices=Membership.Role.values, default=Membership.Role.MEMBER
        )
        parser.add_argument("--no-sandbox", action="store_true", help="May not use Sandbox.")

    def handle(self, *args, email, org, role, no_sandbox, **options):
        organization = Organization.objects.filter(slug=org).first()
        if organization is None:
            raise CommandError(f"No organization with slug {org!r}.")
        password = os.environ.get("QUOR_NEW_PASSWORD") or None
        generated = password is None
        if generated:
            password = services.generate_password()
        try:
            user = services.member_create(
                email=email,
                organization=organization,
                role=role,
                can_use_sandbox=not no_sandbox,
                password=password,
            )
        except QuorError as exc:
            raise CommandError(exc.message) from None
        self.stdout.write(f"Created {role} {user.email} in {organization.slug}.")
        if generated:
            self.stdout.write(f"Password (shown once): {password}")
