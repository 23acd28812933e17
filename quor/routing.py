"""WebSocket routes of every app, gathered for the ASGI application."""

from sandboxes.sessions.routing import websocket_urlpatterns as sandbox_routes
from sandboxes.terminal.routing import websocket_urlpatterns as terminal_routes
from webapps.routing import websocket_urlpatterns as tunnel_routes

websocket_urlpatterns = [*sandbox_routes, *terminal_routes, *tunnel_routes]
