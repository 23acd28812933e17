from django.conf import settings
from django.contrib import messages
from django.contrib.auth import logout
from django.http import Http404, HttpResponse, JsonResponse
from django.shortcuts import redirect, render, resolve_url
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods, require_POST

from quor import health, selectors, services
from quor.lib.errors import NotFound, QuorError, error_response
from quor.lib.login_attempts import sign_in_rate_limited
from quor.lib.permissions import Permission, page_requires, public_page
from quor.sso import (
    LogoutTokenRefused,
    SignInRefused,
    back_channel_logout,
    sign_in_complete,
    sign_in_start,
    sign_out_url,
    single_sign_on_for,
)


@public_page
@never_cache
def healthz(request):
    return JsonResponse({"status": "ok"})


@public_page
@never_cache
def readyz(request):
    checks = health.readiness()
    ready = all(state == "ok" for state in checks.values())
    return JsonResponse(
        {"status": "ok" if ready else "unavailable", "checks": checks}, status=200 if ready else 503
    )


def server_error(request):
    """The API's 500 is JSON like every other API error; pages get a plain page."""
    if request.path.startswith("/api/"):
        return error_response(500, "server_error", "Something went wrong on our side.")
    return render(request, "500.html", status=500)


@public_page
def api_not_found(request, unmatched=""):
    return error_response(404, "not_found", f"No API endpoint at {request.path}.")


@never_cache
@page_requires(Permission.ACCOUNT)
@require_http_methods(["GET", "HEAD", "POST"])
def api_tokens(request):
    """The user's personal API tokens; a POST creates one, whose value this response
    shows once (it is not stored, so no later page can show it)."""
    name, error, created = "", "", None
    if request.method == "POST":
        name = request.POST.get("name", "")
        try:
            token, raw_token = services.api_token_create(user=request.user, name=name)
        except QuorError as exc:
            error = exc.message
        else:
            created, name = {"token": token, "value": raw_token}, ""
    return render(
        request,
        "quor/api_tokens.html",
        {
            "tokens": selectors.api_tokens_of(request.user),
            "name": name,
            "error": error,
            "created": created,
        },
        status=400 if error else 200,
    )


@page_requires(Permission.ACCOUNT)
@require_POST
def api_token_revoke(request, token_id):
    try:
        token = services.api_token_revoke(user=request.user, token_id=token_id)
    except NotFound:
        raise Http404("No such token.") from None
    except QuorError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(
            request, f"Revoked “{token.name}”. Programs using it can no longer sign in."
        )
    return redirect("api-tokens")


@public_page
@never_cache
@require_http_methods(["GET", "HEAD", "POST"])
@sign_in_rate_limited
def sso_start(request):
    """The single sign-on form (a link an administrator hands out may fill in the
    organization); its POST sends the browser to the organization's identity provider.
    A POST with the CSRF token, so that another site cannot start a sign-in of its
    choosing in a visitor's browser."""
    data = request.POST if request.method == "POST" else request.GET
    next_path = _safe_next(request, data.get("next", ""))
    organization = data.get("organization", "").strip()
    if request.method != "POST" or not organization:
        return render(
            request,
            "registration/sso_start.html",
            {"next": next_path, "organization": organization},
        )
    try:
        sso = single_sign_on_for(organization)
        provider_url = sign_in_start(request, sso, next_path)
    except SignInRefused as exc:
        return _sso_error(request, exc)
    return _to_identity_provider(
        request, provider_url, f"Taking you to {sso.organization.name}'s identity provider."
    )


@public_page
@never_cache
@require_http_methods(["GET"])
@sign_in_rate_limited(methods=("GET",))
def sso_callback(request):
    try:
        _user, next_path = sign_in_complete(request)
    except SignInRefused as exc:
        return _sso_error(request, exc)
    return redirect(next_path)


def _safe_next(request, next_path: str) -> str:
    if next_path and url_has_allowed_host_and_scheme(
        next_path, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return next_path
    return resolve_url(settings.LOGIN_REDIRECT_URL)


def _sso_error(request, refusal: SignInRefused):
    return render(
        request,
        "registration/sso_error.html",
        {"message": refusal.message, "reason": refusal.reason},
        status=refusal.status,
    )


@public_page
@require_POST
def log_out(request):
    """Logs out of Quor and, after an SSO sign-in, of the identity provider too."""
    login_page = request.build_absolute_uri(reverse("login"))
    provider_logout = sign_out_url(request, login_page)
    logout(request)
    if provider_logout is None:
        return redirect(login_page)
    return _to_identity_provider(
        request, provider_logout, "Signing you out of your identity provider too."
    )


def _to_identity_provider(request, provider_url: str, message: str):
    """A page that moves on by itself rather than a redirect: Quor's
    Content-Security-Policy (form-action 'self') stops a form's redirect to another site."""
    return render(
        request,
        "registration/to_identity_provider.html",
        {"provider_url": provider_url, "message": message},
    )


@public_page
@csrf_exempt  # the identity provider's server calls it, with a signed token
@never_cache
@require_POST
def sso_back_channel_logout(request):
    """OpenID Connect Back-Channel Logout: the provider tells Quor a session ended."""
    try:
        back_channel_logout(request.POST.get("logout_token", ""))
    except LogoutTokenRefused as exc:
        return JsonResponse({"error": "invalid_request", "error_description": str(exc)}, status=400)
    return HttpResponse(status=200)
