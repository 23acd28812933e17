"""The warm pool on real containers: what a sandbox takes from it, what it never holds,
and how it is kept fresh."""

import json
import time

import pytest

from quor.lib.locks import advisory_try_lock
from sandboxes.backends import get_backend
from sandboxes.backends.memory import MemoryBackend
from sandboxes.image import WORKSPACE
from sandboxes.models import PooledRuntime, Sandbox
from sandboxes.runtime import services
from sandboxes.runtime.pool import pool_refill, pools_refill
from tests import factories
from tests.egress.test_proxy import through_proxy
from tests.sandboxes.conftest import held_back
from tests.sandboxes.test_sleep_and_wake import sleep
from tests.sandboxes.test_tasks import wait_for_state

pytestmark = [pytest.mark.docker, pytest.mark.django_db(transaction=True)]

# Everything the runtime's own processes were started with, and what a command sent
# without any environment sees.
RUNTIME_ENVIRONMENT = "cat /proc/1/environ | tr '\\0' '\\n'; echo; env"


@pytest.fixture
def refills(monkeypatch):
    """The refills asked for: the tests run them, not a worker with other settings."""
    return held_back(monkeypatch, "sandboxes.tasks.refill_pool")


@pytest.fixture
def pool(settings, egress_proxy, clean_runtimes, refills):
    """A pool of two ready runtimes."""
    settings.QUOR_SANDBOX_POOL_SIZE = 2
    assert pool_refill() == 2
    return get_backend()


def ready_keys() -> list[str]:
    return list(
        PooledRuntime.objects.filter(state=PooledRuntime.State.READY).values_list("key", flat=True)
    )


def run(backend, key: str, script: str, env=None) -> str:
    result = backend.exec(
        key, ["sh", "-c", script], cwd=WORKSPACE, env=env or {}, timeout_s=60, output_limit=1 << 20
    )
    assert result.exit_code == 0, result.stderr
    return result.stdout.decode()


def shell(user, script: str) -> str:
    result = services.sandbox_exec(user=user, argv=["sh", "-c", script], timeout_s=60)
    assert result.exit_code == 0, result.stderr
    return result.stdout.decode()


def test_a_first_sandbox_takes_a_ready_runtime_and_the_pool_is_refilled(pool, owner, refills):
    before = ready_keys()
    sandbox = services.sandbox_ensure(user=owner)
    assert refills == ["sandboxes.tasks.refill_pool"]
    assert sandbox.state == Sandbox.State.RUNNING
    assert sandbox.runtime_key in before and sandbox.runtime_key not in ready_keys()
    assert sandbox.runtime_id == pool.status(sandbox.runtime_key).runtime_id
    assert shell(owner, "id -un; pwd") == f"sandbox\n{WORKSPACE}\n"

    assert pool_refill() == 1
    assert len(ready_keys()) == 2 and sandbox.runtime_key not in ready_keys()


def test_a_pooled_runtime_holds_no_identity_and_its_requests_are_refused(pool, owner, settings):
    key = ready_keys()[0]
    sandbox = services.sandbox_ensure(user=owner)  # takes the oldest: `key`
    assert sandbox.runtime_key == key
    other = ready_keys()[0]
    seen = run(pool, other, RUNTIME_ENVIRONMENT)
    for value in (sandbox.placeholder, sandbox.proxy_token, sandbox.runtime_credential):
        assert value not in seen
    assert "quor-placeholder-" not in seen and "PROXY=" not in seen

    host, port = pool.egress_proxy_address(), settings.QUOR_EGRESS_PROXY_PORT
    refused = run(
        pool,
        other,
        "python3 -c 'import sys, urllib.request as u; "
        'o = u.build_opener(u.ProxyHandler({"http": sys.argv[1]}));\n'
        'try: o.open("http://quor-api/api/v1/runtime/whoami/", timeout=10)\n'
        "except u.HTTPError as e: print(e.code, e.read().decode())' "
        f"http://sandbox:{sandbox.proxy_token}@{host}:{port}",
    )
    assert refused.startswith("403") and "egress.unidentified_sandbox" in refused


def test_the_sandbox_that_took_a_runtime_is_known_to_the_proxy_at_once(pool, owner):
    sandbox = services.sandbox_ensure(user=owner)
    assert sandbox.runtime_key
    [whoami] = through_proxy(
        owner,
        [
            {
                "url": "http://quor-api/api/v1/runtime/whoami/",
                "headers": {"Authorization": "Bearer $QUOR_API_TOKEN"},
            }
        ],
    )
    assert whoami["status"] == 200, whoami
    assert json.loads(whoami["body"])["sandbox"] == str(sandbox.pk)
    assert sandbox.placeholder in shell(owner, "echo $QUOR_API_TOKEN $ANTHROPIC_API_KEY")


def test_nothing_of_one_user_reaches_another_through_the_pool(pool, owner, org):
    first = services.sandbox_ensure(user=owner)
    shell(owner, "echo owner-secret > notes.txt; echo owner-tmp > /tmp/left-behind")
    services.sandbox_destroy(sandbox=first)
    assert not pool.status(first.runtime_key).exists
    pool_refill()
    assert first.runtime_key not in ready_keys()  # a runtime is never given back

    colleague = factories.make_user(org, email="colleague@acme.test")
    second = services.sandbox_ensure(user=colleague)
    assert second.runtime_key != first.runtime_key
    seen = shell(colleague, f"ls -A {WORKSPACE}; cat /tmp/left-behind 2>&1; {RUNTIME_ENVIRONMENT}")
    assert "notes.txt" not in seen and "owner-tmp" not in seen
    assert first.placeholder not in seen and first.proxy_token not in seen
    assert second.placeholder in seen


def test_a_wake_takes_a_ready_runtime_and_restores_the_snapshot_into_it(pool, owner):
    sandbox = services.sandbox_ensure(user=owner)
    shell(owner, "mkdir -p work && echo kept > work/file.txt")
    sleep(sandbox)
    slept_key = sandbox.runtime_key
    pool_refill()
    ready = ready_keys()

    woken = services.sandbox_ensure(user=owner)
    assert woken.state == Sandbox.State.RUNNING
    assert woken.runtime_key in ready and woken.runtime_key != slept_key
    assert not pool.status(slept_key).exists and not pool.workspace_exists(slept_key)
    assert shell(owner, "cat work/file.txt") == "kept\n"


def test_an_image_upgrade_drains_the_pool_and_no_runtime_of_another_image_is_taken(pool, owner):
    old = ready_keys()
    PooledRuntime.objects.update(image_ref="sha256:an-older-image")

    sandbox = services.sandbox_ensure(user=owner)
    assert sandbox.runtime_key not in old  # started cold: nothing of the current image

    assert pool_refill() == 2
    assert not set(old) & set(ready_keys())
    for key in old:
        assert not pool.status(key).exists and not pool.workspace_exists(key)


def test_a_ready_runtime_waiting_longer_than_the_limit_is_replaced(pool, settings):
    old = ready_keys()
    settings.QUOR_SANDBOX_POOL_MAX_AGE_SECONDS = 0
    time.sleep(0.01)
    pool_refill()
    assert not set(old) & set(ready_keys())
    assert not pool.status(old[0]).exists


def test_a_smaller_pool_size_removes_the_runtimes_above_it(pool, settings):
    settings.QUOR_SANDBOX_POOL_SIZE = 0
    old = ready_keys()
    assert pool_refill() == 0
    assert ready_keys() == [] and not any(pool.status(key).exists for key in old)


def test_a_runtime_that_died_in_the_pool_is_not_handed_out(pool, owner):
    dead = ready_keys()[0]
    pool.stop(dead)
    sandbox = services.sandbox_ensure(user=owner)
    assert sandbox.runtime_key != dead and sandbox.state == Sandbox.State.RUNNING
    assert not pool.status(dead).exists
    assert shell(owner, "echo ok") == "ok\n"


def test_a_refill_that_died_half_way_is_cleaned_up_and_reconciliation_keeps_the_pool(
    pool, settings
):
    settings.QUOR_SANDBOX_POOL_SIZE = 3
    half_made = PooledRuntime.objects.create(backend=pool.name)  # its creator died here
    from sandboxes.runtime.pool import runtime_spec

    pool.ensure(runtime_spec(half_made.key))
    orphan = "0f0f0f0f-0000-4000-8000-000000000000"
    pool.ensure(runtime_spec(orphan))  # a runtime whose row is gone

    found = services.sandboxes_reconcile()
    assert [a for a in found.actions if a.startswith(orphan)]
    assert not [a for a in found.actions if any(key in a for key in ready_keys())]
    assert not pool.status(orphan).exists and len(ready_keys()) == 2

    assert pool_refill() == 1
    assert not pool.status(half_made.key).exists
    assert len(ready_keys()) == 3 and half_made.key not in ready_keys()


def test_a_sandbox_requested_through_the_api_runs_in_a_pooled_runtime(
    pool, celery_worker, client_for, owner
):
    before = ready_keys()
    response = client_for(owner).post("/api/v1/sandbox/", {}, format="json")
    assert response.status_code == 202
    sandbox = wait_for_state(response.json()["id"], {Sandbox.State.RUNNING, Sandbox.State.FAILED})
    assert sandbox.state == Sandbox.State.RUNNING, sandbox.failure_reason
    assert sandbox.runtime_key in before
    assert shell(owner, "echo ok") == "ok\n"

    # The worker refilled after its take, with its own size (0): the pool is emptied
    # once it is done, and no later test meets its refill.
    deadline = time.monotonic() + 30
    while PooledRuntime.objects.exists() or not pool_is_free(pool):
        assert time.monotonic() < deadline, "the worker's refill did not end"
        time.sleep(0.1)


def pool_is_free(backend) -> bool:
    with advisory_try_lock(f"quor-pool:{backend.name}") as locked:
        return locked


def test_a_take_that_died_before_the_sandbox_was_marked_running_is_adopted_next_time(
    pool, owner, monkeypatch
):
    key = ready_keys()[0]

    def crash(*args, **kwargs):
        raise SystemExit("the worker died here")

    with monkeypatch.context() as patched:
        patched.setattr(services, "_record_runtime", crash)
        with pytest.raises(SystemExit):
            services.sandbox_ensure(user=owner)
    left = Sandbox.objects.get(user=owner)
    assert left.state == Sandbox.State.PROVISIONING and left.runtime_key == key
    would_do = services.sandboxes_reconcile(dry_run=True).actions
    assert not [action for action in would_do if key in action and "removed" in action]

    services.sandboxes_reconcile()  # adopts it, with the address the proxy knows it by
    left.refresh_from_db()
    assert left.state == Sandbox.State.RUNNING
    assert left.network_address == pool.status(key).network_address
    sandbox = services.sandbox_ensure(user=owner)
    assert sandbox.state == Sandbox.State.RUNNING and sandbox.runtime_key == key
    assert len(ready_keys()) == 1  # the other one is still there: nothing else was taken
    assert shell(owner, "echo ok") == "ok\n"


def test_a_ready_runtime_that_stopped_is_replaced_by_the_next_refill(pool):
    stopped, running = ready_keys()
    pool.stop(stopped)
    assert pool_refill() == 1
    assert stopped not in ready_keys() and running in ready_keys()
    assert not pool.status(stopped).exists


def test_the_pool_of_a_backend_the_deployment_left_is_emptied(pool, settings, request):
    request.addfinalizer(MemoryBackend.reset)
    settings.DEBUG = True  # the memory backend serves tests only
    settings.QUOR_SANDBOX_BACKEND = "memory"
    assert pool_refill() == 2
    memory = get_backend("memory")
    assert {i.sandbox_id for i in memory.list_instances()} == set(
        PooledRuntime.objects.filter(backend="memory").values_list("key", flat=True)
    )

    settings.QUOR_SANDBOX_BACKEND = "docker"
    pools_refill()
    assert not PooledRuntime.objects.filter(backend="memory").exists()
    assert memory.list_instances() == [] and len(ready_keys()) == 2
