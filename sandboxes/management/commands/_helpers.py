from django.core.management.base import CommandError

from quor.filestore import file_store_check
from quor.lib.errors import QuorError
from quor.models import User
from sandboxes.models import Sandbox


def get_user_by_email(email: str) -> User:
    user = User.objects.filter(email=email.strip().lower()).first()
    if user is None:
        raise CommandError(f"No user {email}.")
    return user


def require_the_workers_file_store() -> None:
    """Operator commands refuse a file store the workers do not use (a checkout with
    other settings): a snapshot written there could never be read back."""
    try:
        file_store_check()
    except QuorError as exc:
        raise CommandError(f"{exc.code}: {exc.message}") from None


def get_sandbox_by_email(email: str) -> Sandbox:
    """The user's sandbox, for an operator command (which may touch the file store)."""
    require_the_workers_file_store()
    sandbox = Sandbox.objects.filter(user=get_user_by_email(email)).first()
    if sandbox is None:
        raise CommandError(f"{email} has no sandbox.")
    return sandbox
