import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "quor.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402  (needs Django set up first)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from quor.routing import websocket_urlpatterns  # noqa: E402
from webapps.proxy import WebAppProxy, route_by_host  # noqa: E402

# Web apps live on their own hosts (`<label>.<base host>`): those requests never reach
# Django, whose cookies and views stay on Quor's origin.
application = route_by_host(
    WebAppProxy(),
    ProtocolTypeRouter(
        {
            "http": django_asgi_app,
            "websocket": AllowedHostsOriginValidator(
                AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
            ),
        }
    ),
)
