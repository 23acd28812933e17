from django.urls import path

from sandboxes.terminal.consumers import TerminalConsumer

websocket_urlpatterns = [
    path("ws/sessions/<str:session_id>/terminal/", TerminalConsumer.as_asgi()),
]
