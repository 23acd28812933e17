import base64
import json

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from apps import policy
from egress.decisions import (
    SANDBOX_PRINCIPAL,
    SESSION_PRINCIPAL_PREFIX,
    Refusal,
    authenticate,
    decide_app,
    decide_destination,
    parse_url,
)
from egress.directory import egress_rules, load_contexts
from egress.resolver import make_resolver
from quor.models import User
from sandboxes.models import Sandbox, Session
from sandboxes.selectors import is_uuid


class Command(BaseCommand):
    help = (
        "Print, as JSON, the decision the egress proxy would take for a request from a "
        "user's sandbox: decision, reason code, resolved addresses, credential kind, and "
        "for an App its matched actions, policy and the credential that would be used."
    )

    def add_arguments(self, parser):
        parser.add_argument("url")
        parser.add_argument("--user", help="Email of the sandbox's owner.")
        parser.add_argument(
            "--session", help="A session id (its token, selected Apps and grants are used)."
        )
        parser.add_argument("--method", default="GET")

    def handle(self, *args, url, user, session, method, **options):
        try:
            target = parse_url(url)
        except Refusal as refusal:
            raise CommandError(f"{refusal.code}: {refusal.reason}") from None
        https = target.scheme == "https"
        sandbox = self._sandbox(user, session)
        context = load_contexts().get(sandbox.network_address or "")
        if context is None:
            raise CommandError("The sandbox has no network address yet: run sandbox_ensure first.")
        principal, token = SANDBOX_PRINCIPAL, sandbox.proxy_token
        if session:
            principal = f"{SESSION_PRINCIPAL_PREFIX}{session}"
            token = Session.objects.get(pk=session).proxy_token
        answer = {"url": url, "method": method.upper(), "sandbox": str(sandbox.pk)}
        try:
            credentials = base64.b64encode(f"{principal}:{token}".encode()).decode()
            answer["principal"] = authenticate(context, f"Basic {credentials}")
            destination = decide_destination(
                context,
                egress_rules(),
                target.host,
                target.port,
                make_resolver(settings.QUOR_EGRESS_DNS_SERVER),
            )
        except Refusal as refusal:
            answer.update(decision="blocked", code=refusal.code, reason=refusal.reason)
        else:
            route = destination.route
            answer.update(
                decision="intercept"
                if destination.intercept
                else ("tunnel" if https else "forward"),
                code="",
                addresses=list(destination.addresses),
                credential=route.kind if route else None,
                credential_available=bool(route and route.secret) if route else None,
            )
            answer["app"] = self._app_answer(
                context, destination, session, method.upper(), target.path, intercepted=https
            )
            app = answer["app"]
            if app and app["outcome"] == policy.REFUSE:
                answer.update(decision="blocked", code=app["reason"])
            elif app and app["outcome"] == policy.PARK:
                answer["decision"] = "ask"
        # This command reads the settings of its own environment, not the running proxy's.
        answer["private_allowlist"] = sorted(
            f"{h}:{p}" for h, p in egress_rules().private_allowlist
        )
        self.stdout.write(json.dumps(answer, indent=2))

    def _app_answer(self, context, destination, session, method, target, *, intercepted):
        decision = decide_app(
            context,
            destination,
            session_id=session,
            method=method,
            target=target,
            intercepted=intercepted,
        )
        if decision.app is None:
            return None
        _, source = context.app_credentials.get(decision.app.app_id, (None, ""))
        credentialed = decision.outcome in (policy.CREDENTIAL, policy.PARK)
        return {
            "name": decision.app.name,
            "id": decision.app.app_id,
            "actions": [
                {"key": a.key, "name": a.name, "policy": a.policy} for a in decision.actions
            ],
            "policy": decision.policy,
            "outcome": decision.outcome,
            "reason": decision.reason,
            "credential": (source or "none") if credentialed else None,
        }

    def _sandbox(self, email, session):
        if session:
            found = (
                Session.objects.select_related("sandbox").filter(pk=session).first()
                if is_uuid(session)
                else None
            )
            if found is None:
                raise CommandError(f"No session {session}.")
            return found.sandbox
        if not email:
            raise CommandError("Give --user EMAIL or --session ID.")
        owner = User.objects.filter(email=email.lower()).first()
        sandbox = Sandbox.objects.filter(user=owner).first() if owner else None
        if sandbox is None:
            raise CommandError(f"{email} has no sandbox.")
        return sandbox
