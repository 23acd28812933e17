from django.urls import path

from webapps.consumers import TunnelConsumer

websocket_urlpatterns = [
    path("ws/tunnels/", TunnelConsumer.as_asgi()),
]
