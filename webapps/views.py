from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect

from quor.lib.errors import NotFound
from webapps import services


@login_required
def open_webapp(request, label):
    """On Quor's origin: checks the viewer may see the app, then hands them off to the
    app's own origin (404 for anyone else, without saying whether it exists)."""
    try:
        webapp = services.get_webapp_for_viewer(request.user, label)
    except NotFound:
        raise Http404("No such web app.") from None
    return redirect(services.handoff_url(request.user, webapp, request.GET.get("next", "/")))
