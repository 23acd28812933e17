from django.contrib import messages
from django.http import Http404, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST

from quor import health, services
from quor.lib.errors import NotFound, QuorError, error_response
from quor.lib.permissions import Permission, page_requires, public_page


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
            "tokens": request.user.api_tokens.all(),
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
