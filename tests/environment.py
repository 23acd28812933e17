"""The environment of a test process: what Quor's settings read, and everything a test
run holds on this machine, given to each pytest-xdist worker apart.

A worker is a slot (0 without xdist, N + 1 for worker gwN, or the slot QUOR_TEST_SLOT
names for a run without xdist beside another run). Each slot has its own
block of ports, Redis database, deployment name (Docker containers, volumes, network,
labels, Redis channels), sandbox subnet, test database (pytest-django's `_gwN`
suffix) and directory under /tmp/quor-test: workers share nothing by accident, and a
run without xdist (slot 0) is a worker like the others.

`tests/settings.py` applies it before `quor/settings.py` reads the environment, so the
processes the tests start (web, worker, proxies) inherit it."""

import itertools
import os
import socket
from pathlib import Path

MAX_SLOTS = 9  # no xdist, and gw0 to gw7: Redis databases 15 down to 7


def slot_of(worker: str) -> int:
    if not worker or worker == "master":
        return 0
    if not (worker.startswith("gw") and worker[2:].isdigit()) or int(worker[2:]) + 1 >= MAX_SLOTS:
        raise RuntimeError(f"at most {MAX_SLOTS - 1} pytest-xdist workers (this is {worker})")
    return int(worker[2:]) + 1


WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if not WORKER and os.environ.get("QUOR_TEST_SLOT"):
    # A second checkout's run beside another one (which uses slots up to its -n): a slot of
    # its own, named like no xdist worker.
    SLOT = int(os.environ["QUOR_TEST_SLOT"])
    if not 0 < SLOT < MAX_SLOTS:
        raise RuntimeError(f"QUOR_TEST_SLOT must be 1 to {MAX_SLOTS - 1}")
    NAME = f"slot{SLOT}"
else:
    SLOT = slot_of(WORKER)
    NAME = WORKER or "main"
RUN_DIR = Path("/tmp/quor-test") / NAME  # logs, file store, CAs of this worker

# A block of 200 ports per slot, far below the kernel's ephemeral ports (32768 and up):
# the first 100 for the servers every worker starts, the rest handed out by free_port().
PORT_BLOCK = 200
FIRST_PORT = 20000 + PORT_BLOCK * SLOT


class PORTS:
    """The fixed ports of this worker's servers."""

    WEB = FIRST_PORT  # Quor's web tier (quor_web): the sandboxes' Quor API
    WEBAPP_PROXY = FIRST_PORT + 1  # the web app proxy process
    EXTRA_WEB = FIRST_PORT + 10  # a daphne a test starts and stops itself
    SECOND_WEB = FIRST_PORT + 11  # a second web process beside quor_web
    SMTP = FIRST_PORT + 25
    PROVIDER = FIRST_PORT + 43  # fake model provider (HTTPS)
    SILENT = FIRST_PORT + 44  # accepts and never answers
    MODEL = FIRST_PORT + 45  # the scripted model (HTTPS)
    TLS_APP = FIRST_PORT + 46  # a fake App (HTTPS)
    DNS = FIRST_PORT + 53  # the fake DNS server the egress proxy asks (UDP)
    APP = FIRST_PORT + 80  # fake Apps (plain HTTP), on 127.0.0.1 and 127.0.0.2
    EGRESS_PROXY = FIRST_PORT + 99


_pool = itertools.cycle(range(FIRST_PORT + 100, FIRST_PORT + PORT_BLOCK))


def free_port(host: str = "127.0.0.1") -> int:
    """A port of this worker's own that nothing listens on now, for a server a test
    starts (in another process, which binds it later). Taken in turn from the worker's
    block, so two workers never get the same one: a port the kernel chose (bind to 0)
    could be chosen again for another worker's server before this one binds it."""
    for port in itertools.islice(_pool, PORT_BLOCK - 100):
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port left in {FIRST_PORT + 100}-{FIRST_PORT + PORT_BLOCK - 1}")


SUBNET = f"10.232.{16 * SLOT}.0/20"
REDIS_DATABASE = 15 - SLOT
DEPLOYMENT = "test" if SLOT == 0 else f"test-{NAME}"

ENVIRONMENT = {
    "QUOR_ENCRYPTION_KEY": "test-only-encryption-key-not-for-production",
    "QUOR_SECRET_KEY": "test-only-secret-key-not-for-production-0123456789",
    "REDIS_URL": f"redis://127.0.0.1:6379/{REDIS_DATABASE}",
    "QUOR_DEPLOYMENT": DEPLOYMENT,
    "QUOR_SANDBOX_POOL_SIZE": "0",
    "QUOR_SSO_ALLOW_LOOPBACK": "true",
    "QUOR_SANDBOX_SUBNET": SUBNET,
    "QUOR_EGRESS_PROXY_PORT": str(PORTS.EGRESS_PROXY),
    "QUOR_SANDBOX_API_URL": f"http://127.0.0.1:{PORTS.WEB}",
    "QUOR_EGRESS_DNS_SERVER": f"127.0.0.1:{PORTS.DNS}",
    # The fakes the sandboxes reach through the proxy, on this host's loopback.
    "QUOR_EGRESS_PRIVATE_ALLOWLIST": ",".join(
        [
            f"provider.test:{PORTS.PROVIDER}",
            f"silent.test:{PORTS.SILENT}",
            f"model.test:{PORTS.MODEL}",
            f"app.test:{PORTS.APP}",
            f"other.test:{PORTS.APP}",
            f"rebind.test:{PORTS.APP}",
            f"apps.test:{PORTS.TLS_APP}",
        ]
    ),
    "QUOR_EGRESS_CA_DIR": str(RUN_DIR / "egress-ca"),
    "QUOR_FILE_STORE_DIR": str(RUN_DIR / "files"),
    "QUOR_APPROVAL_TIMEOUT_SECONDS": "8",
    "QUOR_AGENT_HEARTBEAT_SECONDS": "2",
    "QUOR_PUBLIC_URL": f"http://127.0.0.1:{PORTS.WEB}",
    "QUOR_WEBAPP_BASE_URL": f"http://localhost:{PORTS.WEBAPP_PROXY}",
    "QUOR_WEBAPP_PROXY_BIND": f"127.0.0.1:{PORTS.WEBAPP_PROXY}",
    "QUOR_EMAIL_HOST": "127.0.0.1",
    "QUOR_EMAIL_PORT": str(PORTS.SMTP),
    "QUOR_EMAIL_USE_TLS": "false",
    "QUOR_EXTRA_CA_BUNDLE": str(RUN_DIR / "upstream-ca.crt"),
}
