import os

from django.conf import settings
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "quor.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402  (needs Django set up first)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from quor.lib import metrics  # noqa: E402
from quor.monitoring import DatabaseGauges  # noqa: E402
from quor.routing import websocket_urlpatterns  # noqa: E402
from sandboxes.api.ingest import RuntimeProgressReports  # noqa: E402

# The web process also serves the gauges read from PostgreSQL; under `manage.py serve_web`
# (which set PROMETHEUS_MULTIPROC_DIR) that one serves them and the sum of its processes'.
if settings.QUOR_METRICS_PORT and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    metrics.serve(settings.QUOR_METRICS_PORT, collectors=[DatabaseGauges()])

# Quor only: web apps are served on their own hosts by their own process
# (`manage.py run_webapp_proxy`), never by this one.
application = ProtocolTypeRouter(
    {
        "http": RuntimeProgressReports(django_asgi_app),
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)
