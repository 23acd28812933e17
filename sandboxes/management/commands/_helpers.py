from django.core.management.base import CommandError

from quor.models import User
from sandboxes.models import Sandbox


def get_user_by_email(email: str) -> User:
    user = User.objects.filter(email=email.strip().lower()).first()
    if user is None:
        raise CommandError(f"No user {email}.")
    return user


def get_sandbox_by_email(email: str) -> Sandbox:
    sandbox = Sandbox.objects.filter(user=get_user_by_email(email)).first()
    if sandbox is None:
        raise CommandError(f"{email} has no sandbox.")
    return sandbox
