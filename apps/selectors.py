"""Reading an organization's Apps: for the pages and the API, sessions, the proxy and
`egress_check`."""

from django.db.models import Count, DecimalField, Func, Prefetch, Q, Sum

from apps import policy
from apps.models import App, AppAction, AppCredential
from quor.lib.errors import InvalidInput
from quor.lib.permissions import Permission, get_active_membership, role_has


def enabled_apps(organization):
    return App.objects.filter(organization=organization, enabled=True)


def apps_visible_to(user):
    """The Apps of the user's organization that the user may see: all of them for those
    who may read the organization's configuration, the enabled ones for everyone else."""
    membership = get_active_membership(user)
    apps = App.objects.filter(organization=membership.organization)
    if not role_has(membership.role, Permission.ORGANIZATION_VIEW):
        apps = apps.filter(enabled=True)
    return apps


def apps_with_actions_visible_to(user):
    """The Apps the user may see (apps_visible_to), with their actions."""
    return apps_visible_to(user).prefetch_related("actions")


def enabled_apps_with_actions_visible_to(user):
    """The enabled Apps the user may see, with their actions by name."""
    return (
        apps_visible_to(user)
        .filter(enabled=True)
        .prefetch_related(Prefetch("actions", AppAction.objects.order_by("name")))
    )


def credentials_set(user, apps) -> set[tuple[int, int | None]]:
    """(app id, user id) of the credentials set for these Apps that the user may know
    of: the organization's (user id None) and the user's own, from one query; never a
    secret."""
    return set(
        AppCredential.objects.filter(app__in=apps)
        .filter(Q(user__isnull=True) | Q(user=user))
        .values_list("app_id", "user_id")
    )


def catalog_apps_added(organization) -> dict[str, int]:
    """The organization's Apps added from the catalog: catalog key to App id."""
    return dict(
        App.objects.filter(organization=organization)
        .exclude(catalog_key="")
        .values_list("catalog_key", "pk")
    )


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


class _Epoch(Func):
    template = "extract(epoch FROM %(expressions)s)"
    output_field = DecimalField()


def _rows_by_app(model, organization_ids) -> dict[int, tuple]:
    """App id -> (how many rows of `model` it has, the sum of their updated_at)."""
    return {
        app_id: (count, total)
        for app_id, count, total in model.objects.filter(
            app__organization_id__in=organization_ids, app__enabled=True
        )
        .order_by()
        .values("app_id")
        .annotate(count=Count("pk"), total=Sum(_Epoch("updated_at")))
        .values_list("app_id", "count", "total")
    }


def app_fingerprints(organization_ids) -> dict[int, tuple[int, tuple]]:
    """Per enabled App of these organizations: (its organization's id, a fingerprint
    of the App, its actions and its credentials), read without loading them.

    A saved row moves its updated_at, which moves the sum; an added or deleted row
    moves the count. Sums, not the newest updated_at: a transaction that commits
    after a later one, with an older timestamp, still changes the fingerprint."""
    actions = _rows_by_app(AppAction, organization_ids)
    credentials = _rows_by_app(AppCredential, organization_ids)
    return {
        app_id: (organization_id, (updated_at, actions.get(app_id), credentials.get(app_id)))
        for app_id, organization_id, updated_at in App.objects.filter(
            organization_id__in=organization_ids, enabled=True
        ).values_list("pk", "organization_id", "updated_at")
    }


def policy_apps(app_ids) -> dict[int, policy.App]:
    """These Apps (the enabled ones among them) in their plain form, by id."""
    return {
        app.pk: policy_app(app)
        for app in App.objects.filter(pk__in=app_ids, enabled=True).prefetch_related("actions")
    }


def app_secrets(app_ids) -> dict[int, dict[int | None, str]]:
    """Every credential of these Apps: app id -> user id (None: the organization's) -> secret."""
    secrets: dict[int, dict[int | None, str]] = {}
    for credential in AppCredential.objects.filter(app_id__in=app_ids):
        secrets.setdefault(credential.app_id, {})[credential.user_id] = credential.secret
    return secrets
