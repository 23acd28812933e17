from django.core.management.base import CommandError

from quor.models import User


def get_user_by_email(email: str) -> User:
    user = User.objects.filter(email=email.strip().lower()).first()
    if user is None:
        raise CommandError(f"No user {email}.")
    return user
