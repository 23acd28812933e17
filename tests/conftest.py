import pytest
from rest_framework.test import APIClient

from quor import services
from quor.models import Membership
from tests import environment, factories
from tests.environment import PORTS, RUN_DIR, free_port

pytest_plugins = ["tests.hang_watchdog", "tests.oidc_provider"]


# What a test needs that starts a process of its own: Quor's (web tier, worker, proxies,
# commands, all given `process_env`), the identity provider (Node) or the S3 server.
PROCESS_FIXTURES = {"process_env", "openid_provider", "s3_server"}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """`item.call_failed`: whether the test failed, for a fixture's teardown that says
    more when it did (the browser's unanswered requests)."""
    report = yield
    if report.when in ("setup", "call"):
        item.call_failed = report.failed
    return report


def pytest_collection_modifyitems(items):
    """Tests that start processes get the `processes` mark, from the fixtures they use.

    Then the longest files go first: xdist hands each worker a whole file at a time, in
    this order, so a long one left for the end would keep one worker busy while the
    others are done. Longest is guessed from the marks: `slow`, then browser tests, then
    Docker tests, then the rest; files with more tests first within each."""
    for item in items:
        if PROCESS_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.processes)

    def rank(item):
        return next(
            (
                i
                for i, mark in enumerate(("slow", "browser", "docker"))
                if item.get_closest_marker(mark)
            ),
            3,
        )

    files = {}
    for item in items:
        files.setdefault(item.path, []).append(item)
    ordered = sorted(files.values(), key=lambda tests: (min(map(rank, tests)), -len(tests)))
    items[:] = [item for tests in ordered for item in tests]


@pytest.fixture
def org(db):
    return factories.make_org(name="Acme", slug="acme")


@pytest.fixture
def owner(org):
    """The persona who owns the objects under test."""
    return factories.make_user(org, email="owner@acme.test")


@pytest.fixture
def colleague(org):
    """A member of the owner's organization."""
    return factories.make_user(org, email="colleague@acme.test")


@pytest.fixture
def org_admin(org):
    return factories.make_user(org, role=Membership.Role.ADMIN, email="admin@acme.test")


@pytest.fixture
def stranger(db):
    """A user of another organization."""
    other = factories.make_org(name="Globex", slug="globex")
    return factories.make_user(other, email="stranger@globex.test")


@pytest.fixture
def superuser(db):
    from quor.models import User

    return User.objects.create_superuser(email="root@quor.test", password=factories.PASSWORD)


@pytest.fixture
def api_client():
    return APIClient()


@pytest.fixture
def client_for():
    """An API client authenticated as the given user with a personal API token."""

    def make(user):
        _, raw_token = services.api_token_create(user=user, name="tests")
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_token}")
        return client

    return make


@pytest.fixture(scope="session", autouse=True)
def flush_without_deadlocks():
    """Transactional tests empty the database without deadlocking with the processes
    that use it (tests/database.py)."""
    from django.core.management.commands import flush
    from django.db.backends.postgresql.operations import DatabaseOperations

    from tests.database import emit_post_migrate_signal_unless_kept, sql_flush_without_deadlocks

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DatabaseOperations, "sql_flush", sql_flush_without_deadlocks)
        patch.setattr(flush, "emit_post_migrate_signal", emit_post_migrate_signal_unless_kept)
        yield


@pytest.fixture(scope="session")
def django_db_modify_db_settings_xdist_suffix():
    """pytest-django's suffix is xdist's worker id; a run in a slot of its own
    (QUOR_TEST_SLOT) gets the slot's name, so it never drops another run's database."""
    from pytest_django.fixtures import _set_suffix_to_test_databases

    if environment.SLOT:
        _set_suffix_to_test_databases(suffix=environment.NAME)


@pytest.fixture(scope="session")
def django_db_setup(django_test_environment, django_db_blocker, django_db_modify_db_settings):
    """This process's test database: a copy of one migrated template, not migrated again
    (tests/database.py); dropped at the end whatever is still connected to it."""
    from tests.database import test_database_create, test_database_drop

    with django_db_blocker.unblock():
        name = test_database_create()
    yield
    with django_db_blocker.unblock():
        test_database_drop(name)


@pytest.fixture(scope="session", autouse=True)
def this_workers_docker_objects():
    """What an earlier run of this worker left in Docker (killed, crashed) goes before the
    first test, and what this run made goes after the last: other workers' and other
    deployments' objects are left alone."""
    from tests.docker_helpers import remove_this_workers_docker_objects

    remove_this_workers_docker_objects()
    yield
    remove_this_workers_docker_objects()


@pytest.fixture(autouse=True)
def file_store_checked_afresh():
    """Each test starts from its own database: the once-per-process check of the file
    store (quor/filestore.py) is made again rather than trusted from another test."""
    from quor import filestore

    filestore._checked_locations.clear()


@pytest.fixture(scope="session", autouse=True)
def empty_test_redis():
    """Tests use their own Redis database (REDIS_URL in pyproject); start it empty so
    no task or message from an earlier run leaks in."""
    import redis
    from django.conf import settings

    client = redis.Redis.from_url(settings.REDIS_URL)
    client.flushdb()
    client.close()


@pytest.fixture(autouse=True)
def no_abuse_counts_carried_over():
    """Every test starts with no failed logins and no API request counted: the login
    lockout and the rate limits count per address and organization in Redis, and every
    test's client comes from 127.0.0.1."""
    from quor.lib import login_attempts, throttling

    client = throttling.redis_client()
    for pattern in (login_attempts.KEY_PREFIX + "*", throttling.KEY_PREFIX + "*"):
        for key in client.scan_iter(pattern):
            client.delete(key)


# --- the real Docker Engine, the real egress proxy, and fakes of outside services ---------


@pytest.fixture(scope="session")
def docker_client():
    import docker

    return docker.from_env()


@pytest.fixture(scope="session")
def upstream_fakes():
    """A DNS server the proxy asks, a model provider and an App with real HTTPS (test
    CA), and plain HTTP Apps, all on loopback and reached through the private allowlist."""
    from pathlib import Path
    from types import SimpleNamespace

    from django.conf import settings

    from sandboxes.scripted_model import ScriptedModelServer
    from tests.fakes import FakeDnsServer, RecordingServer, SilentServer, make_test_ca

    _, cert, key = make_test_ca(
        Path(settings.QUOR_EXTRA_CA_BUNDLE).parent, ["provider.test", "model.test", "apps.test"]
    )
    dns_host, dns_port = settings.QUOR_EGRESS_DNS_SERVER.split(":")
    fakes = SimpleNamespace(
        dns=FakeDnsServer(dns_host, int(dns_port)),
        provider=RecordingServer("127.0.0.1", PORTS.PROVIDER, name="provider", tls=(cert, key)),
        app=RecordingServer("127.0.0.1", PORTS.APP, name="app"),
        app_on_127_0_0_2=RecordingServer("127.0.0.2", PORTS.APP, name="app-127.0.0.2"),
        silent=SilentServer("127.0.0.1", PORTS.SILENT),
        model=ScriptedModelServer("127.0.0.1", PORTS.MODEL, tls=(cert, key)),
        tls_app=RecordingServer("127.0.0.1", PORTS.TLS_APP, name="tls-app", tls=(cert, key)),
    )
    fakes.dns.records.update(
        {
            "silent.test": ["127.0.0.1"],
            "model.test": ["127.0.0.1"],
            "provider.test": ["127.0.0.1"],
            "apps.test": ["127.0.0.1"],
            "app.test": ["127.0.0.1"],
            "other.test": ["127.0.0.1"],
            "private.test": ["10.1.2.3"],
            "metadata.test": ["169.254.169.254"],
            "mixed.test": ["93.184.216.34", "127.0.0.1"],
        }
    )
    yield fakes
    for server in (
        fakes.provider,
        fakes.app,
        fakes.app_on_127_0_0_2,
        fakes.silent,
        fakes.model,
        fakes.tls_app,
    ):
        server.close()
    fakes.dns.close()


def _start(argv, env, log_name):
    """Starts a process, in a process group of its own, whose output goes to
    <this worker's RUN_DIR>/<log_name>.log."""
    import subprocess

    log = RUN_DIR / f"{log_name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as output:
        return subprocess.Popen(
            argv, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
        )


def _stop(process):
    """SIGTERM, as a deployment stops it (serve_web stops its daphne processes within
    15 s), then SIGKILL to whatever of its group is left."""
    import contextlib
    import os
    import signal
    import subprocess

    process.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=20)
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    process.wait()


@pytest.fixture(scope="session")
def process_env(django_db_setup):
    """The environment of Quor processes started by tests: this worker's (tests/settings.py),
    on the test database."""
    import os

    from django.conf import settings

    return {**os.environ, "DATABASE_URL": f"postgresql:///{settings.DATABASES['default']['NAME']}"}


@pytest.fixture(scope="session")
def quor_web(process_env):
    """Quor's web tier as deployed (`manage.py serve_web`, two daphne processes) on the
    test database: the sandboxes' Quor API."""
    import sys
    from urllib.parse import urlsplit

    from django.conf import settings

    from tests.docker_helpers import wait_for_http

    url = urlsplit(settings.QUOR_SANDBOX_API_URL)
    process = _start(
        [
            sys.executable, "manage.py", "serve_web",
            "--bind", url.hostname, "--port", str(url.port), "--processes", "2",
        ],
        process_env,
        "quor-web",
    )  # fmt: skip
    wait_for_http(f"{settings.QUOR_SANDBOX_API_URL}/healthz")
    yield settings.QUOR_SANDBOX_API_URL
    _stop(process)


@pytest.fixture(scope="session")
def webapp_proxy(process_env):
    """The web app proxy's own process (`manage.py run_webapp_proxy`) on the
    test database: web apps' hosts. Its address, (host, port)."""
    import sys

    from django.conf import settings

    from tests.docker_helpers import wait_for_port

    host, port = settings.QUOR_WEBAPP_PROXY_BIND.rsplit(":", 1)
    argv = [sys.executable, "manage.py", "run_webapp_proxy", "--access-log"]
    process = _start(argv, process_env, "webapp-proxy")
    wait_for_port(host, int(port))
    yield host, int(port)
    _stop(process)


class EgressProxyProcess:
    """The real egress proxy (`manage.py run_egress_proxy`) in its own process group,
    so that a test can crash it (acceptors included) and start it again."""

    def __init__(self, env):
        from django.conf import settings

        from sandboxes.backends.docker import DockerBackend

        self.env = env
        self.address = DockerBackend().egress_proxy_address(), settings.QUOR_EGRESS_PROXY_PORT
        self.process = None

    def start(self):
        import subprocess
        import sys
        import time

        from tests.docker_helpers import wait_for_egress_proxy

        started = time.time()
        log = RUN_DIR / "egress-proxy.log"
        with open(log, "ab") as output:
            self.process = subprocess.Popen(
                [sys.executable, "manage.py", "run_egress_proxy", "--acceptors", "1"],
                env=self.env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        try:
            wait_for_egress_proxy(self.process, "{}:{}".format(*self.address), started, log)
        except RuntimeError:
            self.stop()
            raise

    def crash(self):
        import os
        import signal

        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self):
        """Stops the whole group, acceptors included, so that no connection to the
        test database outlives it."""
        import os
        import signal
        import time

        for sig, grace in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                self.process.poll()
                if not self._group_alive():
                    return
                time.sleep(0.1)

    def _group_alive(self) -> bool:
        """Whether a process of the group still runs (zombies do not count)."""
        from pathlib import Path

        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == self.process.pid and fields[0] != "Z":
                return True
        return False


@pytest.fixture(scope="session")
def egress_proxy_process(process_env, upstream_fakes, quor_web):
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    (RUN_DIR / "egress-proxy.log").write_bytes(b"")
    proxy = EgressProxyProcess(process_env)
    proxy.start()
    yield proxy
    proxy.stop()


@pytest.fixture(scope="session")
def egress_proxy(egress_proxy_process):
    """The proxy's address on the sandbox bridge."""
    return egress_proxy_process.address


@pytest.fixture(scope="session")
def chromium():
    """What Playwright launches: Debian's Chromium in a network namespace of this worker's
    own, which Docker's interfaces coming and going do not disturb (tests/browser.py)."""
    from tests.browser import BrowserNetwork

    network = BrowserNetwork()
    network.start()
    yield str(network.chromium)
    network.stop()


@pytest.fixture(scope="module")
def headless_chromium(chromium):
    """One headless Chromium for a test file, in which each test opens a profile (context)
    of its own: starting Chromium and Playwright's driver cost about 1 CPU-s a test.
    Playwright's sync API marks its event loop as running in this thread while it lives:
    Django refuses database calls beside it, and asgiref's async_to_sync (how Quor
    publishes to the channel layer) refuses to run. Until the file's last test ends (and
    the loop with it), database calls are allowed, and async_to_sync runs in a thread of
    its own: otherwise an event the test appends reaches the page only through the
    stream's catch-up read, seconds later, and the live path goes untested."""
    from asgiref.sync import AsyncToSync
    from playwright.sync_api import sync_playwright

    from tests.browser import QUIET, outside_the_event_loop

    with pytest.MonkeyPatch.context() as patch, sync_playwright() as playwright:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        patch.setattr(AsyncToSync, "__call__", outside_the_event_loop(AsyncToSync.__call__))
        browser = playwright.chromium.launch(executable_path=chromium, headless=True, args=QUIET)
        yield browser
        browser.close()


@pytest.fixture
def clean_runtimes():
    """Removes every container and volume of the test deployment after the test."""
    from tests.docker_helpers import remove_test_runtimes

    yield
    remove_test_runtimes()


@pytest.fixture
def running_sandbox(owner, egress_proxy, clean_runtimes):
    from sandboxes.runtime import services

    return services.sandbox_ensure(user=owner)


@pytest.fixture(scope="session")
def celery_worker(process_env):
    """A real Celery worker on the test database and the test Redis, all queues."""
    import sys

    process = _start(
        [
            sys.executable, "-m", "celery", "-A", "quor", "worker",
            "-Q", "default,sandboxes,agents,knowledge", "--concurrency", "2",
            "--without-gossip", "--without-mingle", "--loglevel", "WARNING",
        ],
        process_env,
        "celery-worker",
    )  # fmt: skip
    yield process
    _stop(process)


# --- the file store: a directory of the test's own, or a bucket of a real S3 server -------


@pytest.fixture(scope="session")
def s3_server():
    """A real S3-compatible server (moto_server) on loopback: its endpoint URL. Its own
    process, so that its memory never counts in a test's measurement of Quor's."""
    import os
    import sys
    from pathlib import Path

    from tests.docker_helpers import wait_for_port

    port = free_port()
    moto_server = str(Path(sys.executable).parent / "moto_server")
    process = _start([moto_server, "-H", "127.0.0.1", "-p", str(port)], os.environ, "moto-s3")
    wait_for_port("127.0.0.1", port)
    yield f"http://127.0.0.1:{port}"
    _stop(process)


class LocalFileStore:
    """The file store in a directory; tests reach behind it to damage or age objects."""

    kind = "local"

    def __init__(self, root):
        self.root = root

    def keys(self) -> set[str]:
        """Every object but the store's marker."""
        from quor.filestore import MARKER_KEY

        found = {str(p.relative_to(self.root)) for p in self.root.rglob("*") if p.is_file()}
        return found - {MARKER_KEY}

    def read_raw(self, key: str) -> bytes:
        return (self.root / key).read_bytes()

    def write_raw(self, key: str, data: bytes, *, hours_old: float = 0) -> None:
        import os
        import time

        path = self.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        if hours_old:
            then = time.time() - hours_old * 3600
            os.utime(path, (then, then))

    def delete_raw(self, key: str) -> None:
        (self.root / key).unlink()


class S3FileStore:
    """The file store in a bucket of the loopback S3 server. S3 sets an object's time
    itself, so `hours_old` cannot be honoured: sweeps use `min_age=timedelta(0)`."""

    kind = "s3"

    def __init__(self, client, bucket):
        self.client = client
        self.bucket = bucket

    def keys(self) -> set[str]:
        """Every object but the store's marker."""
        from quor.filestore import MARKER_KEY

        listing = self.client.list_objects_v2(Bucket=self.bucket)
        return {entry["Key"] for entry in listing.get("Contents", ())} - {MARKER_KEY}

    def read_raw(self, key: str) -> bytes:
        return self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()

    def write_raw(self, key: str, data: bytes, *, hours_old: float = 0) -> None:
        self.client.put_object(Bucket=self.bucket, Key=key, Body=data)

    def delete_raw(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=key)

    def pending_multipart_uploads(self) -> list:
        return self.client.list_multipart_uploads(Bucket=self.bucket).get("Uploads", [])


def _file_store_settings(monkeypatch, environ: dict) -> dict:
    """The `quor_files` storage that quor/settings.py makes of this environment."""
    import runpy
    from pathlib import Path

    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    settings_file = Path(__file__).resolve().parent.parent / "quor" / "settings.py"
    return runpy.run_path(str(settings_file))["STORAGES"]["quor_files"]


@pytest.fixture
def local_file_store(settings, tmp_path, monkeypatch):
    root = tmp_path / "files"
    storage = _file_store_settings(monkeypatch, {"QUOR_FILE_STORE_DIR": str(root)})
    settings.STORAGES = {**settings.STORAGES, "quor_files": storage}
    return LocalFileStore(root)


@pytest.fixture
def s3_file_store(settings, s3_server, monkeypatch):
    import uuid

    import boto3

    bucket = f"quor-test-{uuid.uuid4().hex[:16]}"
    credentials = {"aws_access_key_id": "test", "aws_secret_access_key": "test"}
    client = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1", **credentials)
    client.create_bucket(Bucket=bucket)
    storage = _file_store_settings(
        monkeypatch,
        {
            "QUOR_FILE_STORE_S3_BUCKET": bucket,
            "QUOR_FILE_STORE_S3_ENDPOINT_URL": s3_server,
            "QUOR_FILE_STORE_S3_REGION": "us-east-1",
            "QUOR_FILE_STORE_S3_ACCESS_KEY_ID": "test",
            "QUOR_FILE_STORE_S3_SECRET_ACCESS_KEY": "test",
        },
    )
    settings.STORAGES = {**settings.STORAGES, "quor_files": storage}
    return S3FileStore(client, bucket)


@pytest.fixture(params=["local", "s3"])
def file_store(request):
    """Runs the test once against a directory and once against the S3 server."""
    return request.getfixturevalue(f"{request.param}_file_store")


@pytest.fixture
def another_file_store(settings, tmp_path, monkeypatch):
    """A context manager: inside it this process's file store is another, empty
    directory, as for an operator command run from a checkout with other settings."""
    from contextlib import contextmanager

    root = tmp_path / "another-store"
    storage = _file_store_settings(monkeypatch, {"QUOR_FILE_STORE_DIR": str(root)})

    @contextmanager
    def using():
        before = settings.STORAGES
        settings.STORAGES = {**before, "quor_files": storage}
        try:
            yield LocalFileStore(root)
        finally:
            settings.STORAGES = before

    return using
