import sys

from django.core.management.base import BaseCommand, CommandError

from quor.lib.errors import QuorError
from sandboxes.management.commands._helpers import get_user_by_email
from sandboxes.models import ExecRecord, Session
from sandboxes.runtime import services


class Command(BaseCommand):
    help = (
        "Run argv in a user's sandbox as the sandbox user, print its output and exit with "
        "its exit code. Usage: sandbox_exec EMAIL [--session ID] [--timeout S] "
        "[--idempotency-key KEY] -- ARGV... The run is in the exec journal; with a key "
        "used before, the first run's output is printed instead of a second run."
    )

    def add_arguments(self, parser):
        parser.add_argument("email")
        parser.add_argument("--session", help="Run in this session's workspace.")
        parser.add_argument("--timeout", type=float, default=None)
        parser.add_argument("--idempotency-key")
        parser.add_argument("argv", nargs="+")

    def handle(self, *args, email, session, timeout, idempotency_key, argv, **options):
        user = get_user_by_email(email)
        session_obj = None
        if session:
            session_obj = Session.objects.filter(pk=session, owner=user).first()
            if session_obj is None:
                raise CommandError(f"{email} has no session {session}.")
        try:
            result = services.sandbox_exec(
                user=user,
                session=session_obj,
                argv=argv,
                timeout_s=timeout,
                idempotency_key=idempotency_key,
                via=ExecRecord.Via.COMMAND,
            )
        except QuorError as exc:
            raise CommandError(exc.message) from None
        sys.stdout.buffer.write(result.stdout)
        sys.stdout.flush()
        sys.stderr.buffer.write(result.stderr)
        notes = []
        if result.stdout_truncated or result.stderr_truncated:
            notes.append("output truncated")
        if result.replayed:
            notes.append(f"the output of run {result.id}, started {result.started_at:%c}")
        if result.timed_out:
            notes.append(f"timed out after {timeout}s")
        if notes:
            sys.stderr.write(f"[sandbox_exec: {', '.join(notes)}]\n")
        sys.stderr.flush()
        sys.exit(result.exit_code)
