from django.http import JsonResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache

from quor import health
from quor.lib.errors import error_response


@never_cache
def healthz(request):
    return JsonResponse({"status": "ok"})


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


def api_not_found(request, unmatched=""):
    return error_response(404, "not_found", f"No API endpoint at {request.path}.")
