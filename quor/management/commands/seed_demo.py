import os

from django.core.management.base import BaseCommand

from quor import services
from quor.models import Membership, ModelProvider, Organization
from sandboxes.management.commands.run_demo_model import DEMO_MODEL_PORT

DEMO_ORG_SLUG = "demo"
DEMO_MODEL_NAME = "Demo (scripted)"
DEMO_USERS = [
    ("admin@demo.quor.test", Membership.Role.OWNER, "QUOR_DEMO_ADMIN_PASSWORD"),
    ("member@demo.quor.test", Membership.Role.MEMBER, "QUOR_DEMO_MEMBER_PASSWORD"),
]


class Command(BaseCommand):
    help = (
        "Create the Demo organization with an owner (a superuser too), a member and the "
        "'Demo (scripted)' model (used by `make dev`). Creates only what is missing."
    )

    def handle(self, *args, **options):
        organization = Organization.objects.filter(slug=DEMO_ORG_SLUG).first()
        if organization is None:
            organization = services.organization_create(slug=DEMO_ORG_SLUG, name="Demo")
            self.stdout.write("Created organization Demo. Log in at http://127.0.0.1:8000 with:")
            for email, role, password_variable in DEMO_USERS:
                password = os.environ.get(password_variable) or services.generate_password()
                user = services.member_create(
                    email=email, organization=organization, role=role, password=password
                )
                if role == Membership.Role.OWNER:
                    user.is_superuser = True
                    user.save(update_fields=["is_superuser"])
                shown = (
                    f"from {password_variable}" if os.environ.get(password_variable) else password
                )
                self.stdout.write(f"  {role:6} {email}  password: {shown}  (shown once)")
        else:
            self.stdout.write("Demo organization exists.")
        if not organization.model_providers.filter(display_name=DEMO_MODEL_NAME).exists():
            services.model_provider_create(
                organization=organization,
                kind=ModelProvider.Kind.ANTHROPIC,
                display_name=DEMO_MODEL_NAME,
                base_url=f"http://127.0.0.1:{DEMO_MODEL_PORT}",
                api_key="demo-scripted-model-needs-no-key",
                model_names=["scripted-demo"],
            )
            self.stdout.write(f"Added the model '{DEMO_MODEL_NAME}' (no API key needed).")
