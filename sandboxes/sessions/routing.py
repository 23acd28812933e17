from django.urls import path

from sandboxes.sessions.consumers import SessionEventsConsumer

websocket_urlpatterns = [
    path("ws/sessions/<str:session_id>/", SessionEventsConsumer.as_asgi()),
]
