"""WebSocket routes of every app, gathered for the ASGI application."""

websocket_urlpatterns: list = []
