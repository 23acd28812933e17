"""The WebSocket routes, asked by every persona, answer as the permission table
predicts (the site's and the admin's URLs: test_permission_table.py)."""

import pytest
from channels.testing import WebsocketCommunicator

from quor.asgi import application
from quor.routing import websocket_urlpatterns
from tests.quor.test_permission_table import OWN, build_world, expected_answer, fill_route
from tests.scenarios import CONNECT_TIMEOUT_S, run_scenario


@pytest.fixture
def committed_world(transactional_db):
    """The consumer reads on connections of its own: they see committed rows only."""
    return build_world()


# 4400 comes only after the permission and session checks, when the consumer reads the
# query: the terminal's path here carries no size, so "allowed" stops there rather than
# starting a sandbox.
WEBSOCKET_CLOSE_CODES = {4400: "allowed", 4401: "login", 4403: "refused", 4404: "hidden"}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("route", websocket_urlpatterns, ids=lambda r: str(r.pattern))
def test_every_persona_gets_the_websocket_answer_the_table_declares(committed_world, route):
    world = committed_world
    consumer = route.callback.consumer_class
    path = fill_route(
        str(route.pattern), {"session_id": world.kwargs["session-detail"][0]["session_id"]}
    )
    answers = {}
    for persona in world.personas:
        headers = [(b"origin", b"http://localhost")]
        if persona.user is not None:
            session_cookie = world.clients[persona.name, False].cookies["sessionid"].value
            headers.append((b"cookie", f"sessionid={session_cookie}".encode()))

        async def connect(headers=headers):
            communicator = WebsocketCommunicator(application, path, headers=headers)
            connected, close_code = await communicator.connect(CONNECT_TIMEOUT_S)
            await communicator.disconnect()
            return "allowed" if connected else WEBSOCKET_CLOSE_CODES.get(close_code, close_code)

        answers[persona.name] = run_scenario(connect)
    if getattr(consumer, "token_only", False):
        # A relay tunnel opens with an API token only (tests/webapps/test_tunnels.py):
        # a browser's session cookie, whoever's, is no credential there.
        expected = {p.name: "login" for p in world.personas}
    else:
        expected = {
            p.name: expected_answer(p, consumer.required_permission, OWN) for p in world.personas
        }
    assert answers == expected
