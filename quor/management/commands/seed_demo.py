import os

from django.core.management.base import BaseCommand

from quor import services
from quor.models import Membership, Organization

DEMO_ORG_SLUG = "demo"
DEMO_USERS = [
    ("admin@demo.quor.test", Membership.Role.ADMIN, "QUOR_DEMO_ADMIN_PASSWORD"),
    ("member@demo.quor.test", Membership.Role.MEMBER, "QUOR_DEMO_MEMBER_PASSWORD"),
]


class Command(BaseCommand):
    help = "Create the Demo organization with an admin and a member, once (used by `make dev`)."

    def handle(self, *args, **options):
        if Organization.objects.filter(slug=DEMO_ORG_SLUG).exists():
            self.stdout.write("Demo data exists; nothing to do.")
            return
        organization = services.organization_create(slug=DEMO_ORG_SLUG, name="Demo")
        self.stdout.write("Created organization Demo. Log in at http://127.0.0.1:8000 with:")
        for email, role, password_variable in DEMO_USERS:
            password = os.environ.get(password_variable) or services.generate_password()
            user = services.member_create(
                email=email, organization=organization, role=role, password=password
            )
            if role == Membership.Role.ADMIN:
                user.is_superuser = True
                user.save(update_fields=["is_superuser"])
            shown = f"from {password_variable}" if os.environ.get(password_variable) else password
            self.stdout.write(f"  {role:6} {email}  password: {shown}  (shown once)")
