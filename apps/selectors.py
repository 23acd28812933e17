"""Reading an organization's Apps: for sessions, the proxy and `egress_check`."""

from apps import policy
from apps.models import App, AppCredential
from quor.lib.errors import InvalidInput


def enabled_apps(organization):
    return App.objects.filter(organization=organization, enabled=True)


def apps_for_selection(organization, app_ids) -> list[App]:
    """The enabled Apps of the organization with these ids; unknown ids are a 400."""
    wanted = set(app_ids)
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in wanted):
        raise InvalidInput("Apps are given by their numeric ids.", code="apps.unknown_app")
    found = list(enabled_apps(organization).filter(pk__in=wanted))
    missing = wanted - {app.pk for app in found}
    if missing:
        raise InvalidInput(
            f"Unknown or disabled Apps: {', '.join(str(i) for i in sorted(missing))}.",
            code="apps.unknown_app",
        )
    return found


def policy_app(app: App) -> policy.App:
    """The plain form of an App that the pure policy functions take."""
    return policy.App(
        app_id=app.pk,
        name=app.name,
        url_patterns=tuple(policy.parse_url_pattern(p) for p in app.url_patterns),
        actions=tuple(
            policy.Action.build(a.key, a.name, a.policy, a.methods, a.paths)
            for a in app.actions.all()
        ),
        custom=app.is_custom,
        deny_when_not_selected=app.when_not_selected == App.WhenNotSelected.DENY,
        credential_style=app.credential_style,
        credential_header=(app.credential_header or "authorization").lower(),
    )


def policy_indexes(organization_ids) -> dict[int, policy.AppIndex]:
    """Each organization's enabled Apps, indexed by host."""
    by_org: dict[int, list[policy.App]] = {org_id: [] for org_id in organization_ids}
    for app in App.objects.filter(organization_id__in=by_org, enabled=True).prefetch_related(
        "actions"
    ):
        by_org[app.organization_id].append(policy_app(app))
    return {org_id: policy.AppIndex(apps) for org_id, apps in by_org.items()}


def app_secrets(organization_ids) -> dict[tuple[int, int | None], str]:
    """Every credential of these organizations' Apps: (app id, user id or None) -> secret."""
    return {
        (c.app_id, c.user_id): c.secret
        for c in AppCredential.objects.filter(
            app__organization_id__in=organization_ids, app__enabled=True
        )
    }


def credential_for(secrets, app_id: int, user_id: int) -> tuple[str | None, str]:
    """The user's own credential, else the organization's: (secret, "user"|"organization"|"")."""
    if (app_id, user_id) in secrets:
        return secrets[(app_id, user_id)], "user"
    if (app_id, None) in secrets:
        return secrets[(app_id, None)], "organization"
    return None, ""
