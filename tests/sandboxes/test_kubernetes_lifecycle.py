"""The sandbox lifecycle (Quor's services, as the API and the workers call them) on the
Kubernetes backend, against the fake API server that runs pods on the local Docker Engine:
the same outcomes and error codes as on Docker."""

import pytest
from django.test import override_settings

from quor.lib.errors import QuorError
from sandboxes.models import PooledRuntime, Sandbox
from sandboxes.runtime import services
from sandboxes.runtime.pool import pool_refill
from tests.sandboxes.backends.conftest import KubernetesEngine

pytestmark = [pytest.mark.docker, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def cluster(tmp_path, settings):
    engine = KubernetesEngine(tmp_path)
    settings.QUOR_SANDBOX_BACKEND = "kubernetes"
    yield engine
    backend = engine.backend()
    for sandbox_id in {i.sandbox_id for i in backend.list_instances()} | set(
        backend.list_workspaces()
    ):
        backend.destroy(sandbox_id, remove_workspace=True)
    engine.close()


def shell(owner, script: str) -> bytes:
    result = services.sandbox_exec(user=owner, argv=["sh", "-c", script], timeout_s=60)
    assert result.exit_code == 0, result.stderr
    return result.stdout


def test_a_sandbox_sleeps_into_the_file_store_and_wakes_in_a_new_pod(owner, cluster):
    sandbox = services.sandbox_ensure(user=owner)
    sid = str(sandbox.pk)
    backend = cluster.backend()
    assert sandbox.backend == "kubernetes" and sandbox.state == Sandbox.State.RUNNING
    first_pod = backend.status(sid).runtime_id
    shell(
        owner,
        "mkdir -p work && head -c 200000 /dev/urandom > work/data.bin && chmod 600 work/data.bin",
    )
    before = shell(owner, "sha256sum work/data.bin; stat -c %a work/data.bin")

    snapshot = services.sandbox_sleep(sandbox=sandbox, force=True)
    sandbox.refresh_from_db()
    assert sandbox.state == Sandbox.State.SLEEPING and snapshot.workspace_bytes > 200000
    assert not backend.status(sid).exists and not backend.workspace_exists(sid)

    woken = services.sandbox_ensure(user=owner)
    assert woken.state == Sandbox.State.RUNNING
    assert backend.status(sid).runtime_id != first_pod
    assert shell(owner, "sha256sum work/data.bin; stat -c %a work/data.bin") == before


def test_a_pod_deleted_behind_quors_back_is_noticed_and_a_new_one_gets_the_workspace(
    owner, cluster
):
    sandbox = services.sandbox_ensure(user=owner)
    shell(owner, "echo kept > note.txt")
    cluster.lose_runtime(str(sandbox.pk))
    services.sandbox_refresh_state(sandbox)
    sandbox.refresh_from_db()
    assert sandbox.state == Sandbox.State.ABSENT  # its workspace claim is there
    services.sandbox_ensure(user=owner)
    assert shell(owner, "cat note.txt") == b"kept\n"


def test_an_evicted_pod_is_stopped_and_the_next_request_starts_a_new_one(owner, cluster):
    sandbox = services.sandbox_ensure(user=owner)
    shell(owner, "echo kept > note.txt")
    backend = cluster.backend()
    cluster.fake.evict(backend.namespace, backend.pod_name(str(sandbox.pk)))
    services.sandbox_refresh_state(sandbox)
    sandbox.refresh_from_db()
    assert sandbox.state == Sandbox.State.STOPPED
    assert services.sandbox_ensure(user=owner).state == Sandbox.State.RUNNING
    assert shell(owner, "cat note.txt") == b"kept\n"


def test_an_unreachable_api_server_is_the_same_error_as_an_unreachable_docker(owner, cluster):
    with (
        override_settings(QUOR_KUBERNETES_KUBECONFIG=str(cluster.dead_kubeconfig)),
        pytest.raises(QuorError) as refused,
    ):
        services.sandbox_ensure(user=owner)
    assert refused.value.code == "sandboxes.unavailable"
    assert refused.value.status == 503


def test_a_first_sandbox_takes_a_ready_pod_from_the_warm_pool(owner, cluster, settings):
    settings.QUOR_SANDBOX_POOL_SIZE = 1
    assert pool_refill() == 1
    [key] = PooledRuntime.objects.values_list("key", flat=True)
    backend = cluster.backend()
    environment = backend.exec(
        key,
        ["sh", "-c", "cat /proc/1/environ"],
        cwd="/",
        env={},
        timeout_s=30,
        output_limit=1 << 20,
    ).stdout.decode()

    sandbox = services.sandbox_ensure(user=owner)
    assert sandbox.runtime_key == key and sandbox.runtime_id == backend.status(key).runtime_id
    assert "QUOR_API_URL" in environment and sandbox.placeholder not in environment
    assert (
        shell(owner, "id -un; echo $QUOR_API_TOKEN") == f"sandbox\n{sandbox.placeholder}\n".encode()
    )
