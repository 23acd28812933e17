"""The Apps page: members see their organization's enabled Apps and what each action
may do, and connect or disconnect their own token. Same services as the API."""

from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from apps import selectors, services
from apps.catalog import catalog_app
from quor.lib.errors import QuorError
from quor.lib.permissions import Permission, page_requires


def _app_or_404(user, app_id):
    try:
        return services.get_app_for_member(user, app_id)
    except QuorError:
        raise Http404("No such App.") from None


@page_requires(Permission.ACCOUNT)
def app_list(request):
    try:
        apps = list(selectors.enabled_apps_with_actions_visible_to(request.user))
    except QuorError as exc:
        return render(request, "apps/app_list.html", {"apps": [], "unavailable": exc.message})
    credentials = selectors.credentials_set(request.user, apps)
    for app in apps:
        app.has_organization_credential = (app.pk, None) in credentials
        app.has_my_credential = (app.pk, request.user.pk) in credentials
        entry = catalog_app(app.catalog_key) if app.catalog_key else None
        app.credential_help = entry.credential_help if entry else ""
    return render(request, "apps/app_list.html", {"apps": apps})


@page_requires(Permission.SANDBOX_USE)
@require_POST
def app_credential_set(request, app_id):
    app = _app_or_404(request.user, app_id)
    try:
        services.app_credential_set(app=app, user=request.user, secret=request.POST.get("secret"))
    except QuorError as exc:
        messages.error(request, f"{app.name}: {exc.message}")
    else:
        messages.success(request, f"Your {app.name} token is connected.")
    return redirect("app-list")


@page_requires(Permission.SANDBOX_USE)
@require_POST
def app_credential_clear(request, app_id):
    app = _app_or_404(request.user, app_id)
    services.app_credential_clear(app=app, user=request.user)
    messages.success(request, f"Your {app.name} token is removed.")
    return redirect("app-list")
