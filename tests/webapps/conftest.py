"""The web app tests' shared pieces: a test app running inside a real sandbox
(`sandbox_app.py`, as the sandbox user) registered as the session's web app, and plain
HTTP helpers that reach it through the web app proxy's own process (`webapp_proxy`,
`manage.py run_webapp_proxy`) on the app's own host. Quor's web process (daphne,
`quor_web`) keeps the hand-off and the viewer page."""

import email
import http.client
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.test import Client

from sandboxes.runtime import services
from tests import factories
from webapps import services as webapps

APP_PORT = 8080
APP_SOURCE = (Path(__file__).parent / "sandbox_app.py").read_text()
# Where `manage.py run_webapp_proxy` listens (the `webapp_proxy` fixture starts it).
_host, _port = settings.QUOR_WEBAPP_PROXY_BIND.rsplit(":", 1)
PROXY = (_host, int(_port))


@pytest.fixture
def webapp(owner, running_sandbox, quor_web, webapp_proxy):
    session = factories.make_session(owner, sandbox=running_sandbox)
    services.sandbox_exec(
        user=owner,
        argv=[
            "sh", "-c",
            'setsid python3 -c "$1" "$2" "$3" > /tmp/app.log 2>&1 < /dev/null & '
            'for i in $(seq 50); do python3 -c "import socket; socket.create_connection((\'127.0.0.1\', $2))" 2>/dev/null && exit 0; sleep 0.1; done; exit 1',
            "sh", APP_SOURCE, str(APP_PORT), settings.QUOR_PUBLIC_URL,
        ],
    )  # fmt: skip
    return webapps.webapp_register(session=session, port=APP_PORT, command="python3 app.py")


def app_host(webapp) -> str:
    return urlsplit(webapps.app_origin().origin(webapp.label)).netloc


def fetch(webapp, path="/", *, method="GET", headers=None, body=None):
    connection = http.client.HTTPConnection(*PROXY, timeout=30)
    connection.request(
        method, path, body=body, headers={"Host": app_host(webapp), **(headers or {})}
    )
    return connection.getresponse()


def cookie_for(user, webapp) -> str:
    """What the hand-off leaves in the viewer's browser, obtained the way a browser does."""
    browser = Client()
    browser.force_login(user)
    handoff = browser.get(f"/webapps/{webapp.label}/open")
    assert handoff.status_code == 302, handoff.status_code
    target = urlsplit(handoff["Location"])
    assert target.netloc == app_host(webapp)
    response = fetch(webapp, f"{target.path}?{target.query}")
    assert response.status == 302
    set_cookie = response.getheader("Set-Cookie")
    assert "HttpOnly" in set_cookie and "Domain" not in set_cookie
    return set_cookie.split(";")[0]


class Mailbox:
    """What the test SMTP server received: (recipients, parsed message), in order."""

    def __init__(self):
        self.messages = []

    async def handle_DATA(self, server, session, envelope):  # aiosmtpd's handler hook
        self.messages.append((envelope.rcpt_tos, email.message_from_bytes(envelope.content)))
        return "250 OK"

    def wait_for(self, recipient: str, seconds: float = 15):
        """The first message to `recipient`, once it has arrived."""
        deadline = time.monotonic() + seconds
        while True:
            for recipients, message in self.messages:
                if recipient in recipients:
                    return message
            assert time.monotonic() < deadline, f"no mail to {recipient}"
            time.sleep(0.05)


@pytest.fixture(scope="session")
def smtp_server():
    """A real SMTP server (aiosmtpd) where QUOR_EMAIL_HOST and QUOR_EMAIL_PORT point in
    the tests (pyproject), so the web app proxy's processes send it their mail."""
    from aiosmtpd.controller import Controller

    mailbox = Mailbox()
    controller = Controller(mailbox, hostname=settings.EMAIL_HOST, port=settings.EMAIL_PORT)
    controller.start()
    yield mailbox
    controller.stop()


@pytest.fixture
def mailbox(smtp_server):
    smtp_server.messages.clear()
    return smtp_server
