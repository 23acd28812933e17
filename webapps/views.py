from urllib.parse import urlencode

from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.clickjacking import xframe_options_deny

from quor.lib.errors import NotFound
from quor.lib.permissions import Permission, page_requires
from webapps import services, tunnels


def _webapp_or_404(user, label):
    """The web app, or the relay tunnel (open now), the viewer may open; both are
    served by the web app proxy and handed off the same way."""
    if tunnels.is_tunnel_label(label):
        found = tunnels.tunnel_for_viewer(user, label)
        if found is None:
            raise Http404("No such web app.")
        return found[0]
    try:
        return services.get_webapp_for_viewer(user, label)
    except NotFound:
        raise Http404("No such web app.") from None


@page_requires(Permission.WEBAPP_VIEW)
@xframe_options_deny
def view_webapp(request, label):
    """A tab showing the app: a full-window frame with the preview's sandbox. The app
    runs with an opaque origin either way; framed by Quor, its own requests carry the
    viewer cookie (partitioned under Quor's site) even where third-party cookies are
    blocked, which a top-level opaque document's requests would not."""
    webapp = _webapp_or_404(request.user, label)
    next_path = services.safe_next(request.GET.get("next", "/"))
    return render(
        request,
        "webapps/viewer.html",
        {"webapp": webapp, "frame_url": f"/webapps/{label}/open?{urlencode({'next': next_path})}"},
    )


@page_requires(Permission.WEBAPP_VIEW)
def open_webapp(request, label):
    """On Quor's origin: checks the viewer may see the app, then hands them off to the
    app's own origin (404 for anyone else, without saying whether it exists)."""
    webapp = _webapp_or_404(request.user, label)
    return redirect(services.handoff_url(request.user, webapp, request.GET.get("next", "/")))
