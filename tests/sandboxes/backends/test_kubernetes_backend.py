"""What only the Kubernetes backend has to get right, against the fake API server that runs
each pod on the local Docker Engine (tests/kubernetes_api.py): the firewall seen from
inside the pod, pods that end (evicted, a firewall that refuses to start, an image the
cluster cannot get), an expired watch, an old server, commands and REST calls at once.
The backend contract itself runs in test_contract.py."""

import base64
import dataclasses
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import docker
import kubernetes
import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings
from kubernetes.client.rest import ApiException

from sandboxes.backends import channel
from sandboxes.backends.base import BackendError, BackendUnavailable, StartUpChecks
from sandboxes.backends.docker import sandbox_network_gateway
from sandboxes.backends.kubernetes import (
    FIREWALL_CONTAINER,
    SANDBOX_CONTAINER,
    KubernetesBackend,
    _KubernetesExecution,
    _refused,
    exec_secret_name,
)
from sandboxes.image import EXEC_CHANNEL
from tests.docker_helpers import canary_server
from tests.sandboxes.backends.conftest import KubernetesEngine, new_spec

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    engine = KubernetesEngine(tmp_path_factory.mktemp("cluster"))
    yield engine
    engine.close()


@pytest.fixture
def started(cluster):
    """Starts sandboxes of the test's own (removed with their workspaces after it)."""
    backend, made = cluster.backend(), []

    def start(**fields):
        spec = new_spec(**fields)
        made.append(spec.sandbox_id)
        backend.ensure(spec)
        return spec

    yield backend, start
    for sandbox_id in made:
        backend.destroy(sandbox_id, remove_workspace=True)


def run(backend, sandbox_id, argv):
    return backend.exec(
        sandbox_id, argv, cwd="/workspace", env={}, timeout_s=30, output_limit=1 << 20
    )


def api(cluster):
    return kubernetes.client.CoreV1Api(
        kubernetes.config.new_client_from_config(config_file=cluster.kubeconfig)
    )


@pytest.fixture
def canary():
    """A server on the sandbox bridge's host address, on a port that is not the proxy's:
    (host, port)."""
    host = sandbox_network_gateway()
    with canary_server(host) as port:
        yield host, port


def test_the_sandbox_user_runs_with_no_capability_behind_a_firewall_it_cannot_change(
    cluster, started, canary
):
    backend, start = started
    spec = start()
    sid = spec.sandbox_id
    status = run(backend, sid, ["cat", "/proc/self/status"]).stdout.decode()
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    assert fields["Uid"].split()[0] == "1000"
    assert {fields[k].strip() for k in ("CapEff", "CapPrm", "CapBnd")} == {"0000000000000000"}
    assert fields["NoNewPrivs"].strip() == "1"
    marker = run(backend, sid, ["cat", "/run/quor/firewall-ready"]).stdout.decode()
    assert f"proxy={sandbox_network_gateway()}:" in marker
    assert run(backend, sid, ["touch", "/run/quor/firewall-ready"]).exit_code != 0
    host, port = canary
    probe = f"import socket; socket.create_connection(({host!r}, {port}), timeout=3)"
    refused = run(backend, sid, ["python3", "-c", probe])
    assert refused.exit_code != 0
    assert b"ConnectionRefusedError" in refused.stderr  # the firewall's reset, at once
    pod = api(cluster).read_namespaced_pod(backend.pod_name(sid), backend.namespace)
    (firewall,) = pod.status.init_container_statuses
    assert firewall.name == FIREWALL_CONTAINER
    assert firewall.state.terminated.exit_code == 0


def test_an_evicted_pod_is_not_running_and_ensure_makes_a_new_one_on_the_same_workspace(
    cluster, started
):
    backend, start = started
    spec = start()
    assert run(backend, spec.sandbox_id, ["sh", "-c", "echo kept > note.txt"]).exit_code == 0
    first = backend.status(spec.sandbox_id)
    cluster.fake.evict(backend.namespace, backend.pod_name(spec.sandbox_id))
    evicted = backend.status(spec.sandbox_id)
    assert not evicted.running and not evicted.network_address
    assert "Evicted" in evicted.detail
    again = backend.ensure(spec)
    assert again.running and again.runtime_id != first.runtime_id
    assert run(backend, spec.sandbox_id, ["cat", "note.txt"]).stdout == b"kept\n"


def test_a_pod_on_a_lost_node_is_force_deleted_after_its_grace(cluster, started, monkeypatch):
    from sandboxes.backends import kubernetes as backend_module

    monkeypatch.setattr(backend_module, "FORCE_AFTER_S", 1)
    monkeypatch.setattr(backend_module, "GONE_TIMEOUT_S", 20)
    backend, start = started
    spec = start()
    name = backend.pod_name(spec.sandbox_id)
    cluster.fake.node_lost = True
    try:
        backend.stop(spec.sandbox_id)
    finally:
        cluster.fake.node_lost = False
    with pytest.raises(ApiException) as gone:
        backend.core.read_namespaced_pod(name, backend.namespace)
    assert gone.value.status == 404
    deletes = [
        path for method, path in cluster.fake.requests if method == "DELETE" and name in path
    ]
    assert len(deletes) == 2  # the graceful one the lost kubelet never confirmed, then forced


def test_a_watch_whose_history_expired_reads_the_pod_again_and_goes_on(
    cluster, started, monkeypatch
):
    original = kubernetes.watch.Watch.stream
    watches = []

    def stream_after_expiry(self, *args, **kwargs):
        """The first watch starts from a version the server has since forgotten."""
        if not watches:
            cluster.fake.expire_watch_history()
            kwargs["resource_version"] = "1"
        watches.append(kwargs["resource_version"])
        return original(self, *args, **kwargs)

    monkeypatch.setattr(kubernetes.watch.Watch, "stream", stream_after_expiry)
    backend, start = started
    spec = start()
    assert backend.status(spec.sandbox_id).running
    assert len(watches) >= 2 and watches[1] != "1"


def test_a_firewall_that_refuses_to_start_fails_the_start_with_its_own_words(cluster):
    backend, spec = cluster.backend(), new_spec()
    try:
        with (
            override_settings(QUOR_KUBERNETES_CONTROL_PLANE_CIDR="10.0.0.0/40"),
            pytest.raises(BackendError, match=r"did not start.*not an IPv4 CIDR"),
        ):
            backend.ensure(spec)
        assert not backend.status(spec.sandbox_id).running
    finally:
        backend.destroy(spec.sandbox_id, remove_workspace=True)


def test_an_image_the_cluster_cannot_get_is_a_clear_error_and_leaves_no_pod(cluster):
    missing = f"quor-sandbox:missing-{uuid.uuid4().hex}"
    backend, spec = cluster.backend(), dataclasses.replace(new_spec(), image=missing)
    try:
        with (
            override_settings(QUOR_KUBERNETES_IMAGE_PULL_POLICY="Never"),
            pytest.raises(BackendError, match=r"quor-sandbox:missing-.* is not available"),
        ):
            backend.ensure(spec)
        assert not backend.status(spec.sandbox_id).exists
    finally:
        backend.destroy(spec.sandbox_id, remove_workspace=True)


def test_the_egress_proxy_address_is_its_services_cluster_ip_and_a_missing_one_is_named(
    cluster,
):
    assert cluster.backend().egress_proxy_address() == sandbox_network_gateway()
    with (
        override_settings(QUOR_KUBERNETES_EGRESS_SERVICE="quor/no-such-proxy"),
        pytest.raises(BackendError, match="quor/no-such-proxy does not exist"),
    ):
        cluster.backend().egress_proxy_address()


def test_commands_and_api_calls_at_once_do_not_disturb_each_other(cluster, started):
    backend, start = started
    spec = start()

    def command(i):
        return run(backend, spec.sandbox_id, ["sh", "-c", f"head -c 300000 /dev/zero; echo {i}"])

    def read_status(_):
        return backend.status(spec.sandbox_id)

    with ThreadPoolExecutor(8) as pool:
        commands = pool.map(command, range(12))
        statuses = pool.map(read_status, range(40))
        results, seen = list(commands), list(statuses)
    assert [r.stdout[300000:] for r in results] == [f"{i}\n".encode() for i in range(12)]
    assert all(status.running for status in seen)


def test_a_server_older_than_the_minimum_is_refused_at_start_up_saying_why(tmp_path, monkeypatch):
    from sandboxes.backends import kubernetes as backend_module
    from tests.kubernetes_api import FakeKubernetes

    monkeypatch.setattr(backend_module, "version_checks", StartUpChecks())  # ports are reused

    old = FakeKubernetes(docker_network="none", version=(1, 29))
    old.start()
    try:
        kubeconfig = old.write_kubeconfig(tmp_path / "kubeconfig")
        with override_settings(
            QUOR_SANDBOX_BACKEND="kubernetes",
            QUOR_KUBERNETES_KUBECONFIG=kubeconfig,
            QUOR_KUBERNETES_CONTROL_PLANE_CIDR="10.244.0.0/16",
        ):
            with pytest.raises(BackendError, match=r"v1\.29\.0 is older than 1\.30"):
                KubernetesBackend().ping()
            with pytest.raises(SystemCheckError, match=r"quor\.E009.*older than 1\.30"):
                call_command("check")
        assert [path for _, path in old.requests if path.startswith("/api/")] == []
    finally:
        old.stop()


def test_start_up_checks_the_kubernetes_settings():
    with (
        override_settings(
            QUOR_SANDBOX_BACKEND="kubernetes",
            QUOR_KUBERNETES_KUBECONFIG="/nonexistent/kubeconfig",
            QUOR_KUBERNETES_CONTROL_PLANE_CIDR="",
            QUOR_KUBERNETES_EGRESS_SERVICE="quor-egress-proxy",
        ),
        pytest.raises(SystemCheckError) as refused,
    ):
        call_command("check")
    message = str(refused.value)
    assert "quor.E007" in message and "quor.E008" in message
    assert "quor.W001" in message and "no Kubernetes configuration" in message


def test_pods_and_claims_of_another_deployment_are_not_listed(cluster, started):
    backend, start = started
    spec = start()
    with override_settings(QUOR_DEPLOYMENT="other"):
        other = cluster.backend()
        assert spec.sandbox_id not in [i.sandbox_id for i in other.list_instances()]
        assert spec.sandbox_id not in other.list_workspaces()
    pod = api(cluster).read_namespaced_pod(backend.pod_name(spec.sandbox_id), backend.namespace)
    assert pod.metadata.labels["org.quor.sandbox-id"] == spec.sandbox_id


def test_a_sandbox_container_that_died_is_not_running_and_ensure_replaces_the_pod(cluster, started):
    backend, start = started
    spec = start()
    assert run(backend, spec.sandbox_id, ["sh", "-c", "echo kept > note.txt"]).exit_code == 0
    first = backend.status(spec.sandbox_id).runtime_id
    pod = backend.pod_name(spec.sandbox_id)
    (container,) = docker.from_env().containers.list(
        filters={
            "label": [
                f"org.quor.fake-kubernetes.pod={pod}",
                f"org.quor.fake-kubernetes.container={SANDBOX_CONTAINER}",
            ]
        }
    )
    container.kill()  # the kernel's OOM killer, say; the archive container runs on
    deadline = time.monotonic() + 30
    while backend.status(spec.sandbox_id).running:
        assert time.monotonic() < deadline, "the dead container still counts as running"
        time.sleep(0.1)
    again = backend.ensure(spec)
    assert again.running and again.runtime_id != first
    assert run(backend, spec.sandbox_id, ["cat", "note.txt"]).stdout == b"kept\n"


@pytest.mark.parametrize(("status", "outage"), [(429, True), (503, True), (403, False)])
def test_throttling_and_a_restarting_api_server_are_outages_not_refusals(status, outage):
    error = _refused(ApiException(status=status, reason="x"))
    assert isinstance(error, BackendUnavailable) is outage
    assert isinstance(error, BackendError)


def test_stdin_is_refused_when_the_server_cannot_close_it():
    class V4Socket:
        subprotocol = "v4.channel.k8s.io"

    with pytest.raises(BackendError, match="did not offer exec v5"):
        _KubernetesExecution(V4Socket()).send_stdin([b"data"])


def test_commands_reach_the_pod_through_its_exec_channel_not_the_api_servers_exec(
    started, monkeypatch
):
    from sandboxes.backends import channel
    from sandboxes.backends.execution import run_bounded

    backend, start = started
    sid = start().sandbox_id
    assert channel.remembered(backend.pod_name(sid))  # ensure found the channel
    monkeypatch.setattr(KubernetesBackend, "_open_exec", lambda *args: pytest.fail("API exec"))
    answer = run(backend, sid, ["sh", "-c", "id -u; cat /proc/1/cmdline | tr '\\0' ' '"])
    assert answer.stdout.decode().splitlines() == ["1000", "/usr/bin/tini -- " + " ".join(
        ["/usr/local/bin/quor-sandbox-entrypoint", "--quor-dropped", "sleep", "infinity"]) + " "
    ]  # fmt: skip
    monkeypatch.undo()
    kill = run_bounded(
        backend._exec_starter(sid, SANDBOX_CONTAINER), ["pkill", "-x", "-f", " ".join(EXEC_CHANNEL)],
        cwd="/", env={}, timeout_s=30, output_limit=4096,
    )  # fmt: skip
    assert kill.exit_code == 0  # the sandbox user's code can do that
    pod_address = backend.status(sid).network_address

    def channel_answers():
        try:
            return channel.run_over_channel(backend.pod_name(sid), pod_address, ["true"])
        except channel.ChannelUnavailable:
            return None

    deadline = time.monotonic() + 10
    while channel_answers() is not None:
        assert time.monotonic() < deadline, "the channel still answers"
        time.sleep(0.05)
    assert run(backend, sid, ["echo", "by the API server"]).stdout == b"by the API server\n"
    assert channel.remembered(backend.pod_name(sid)) is None


def test_the_exec_token_is_in_a_secret_of_the_pods_own_not_in_the_pod(cluster, started):
    """Whoever may read pods reads no token; the sandbox container still gets it (its
    channel answers), and stopping the pod removes it."""
    backend, start = started
    spec = start()
    client = api(cluster)
    pod = client.read_namespaced_pod(backend.pod_name(spec.sandbox_id), backend.namespace)
    token = channel.channel_token(backend.pod_name(spec.sandbox_id))
    assert token not in str(pod.to_dict())
    secret_name = exec_secret_name(backend.deployment, spec.sandbox_id)
    secret = client.read_namespaced_secret(secret_name, backend.namespace)
    assert base64.b64decode(secret.data["token"]).decode() == token
    address = backend.status(spec.sandbox_id).network_address
    answer = channel.run_over_channel(backend.pod_name(spec.sandbox_id), address, ["id", "-u"])
    assert answer.stdout == b"1000\n"

    backend.stop(spec.sandbox_id)
    with pytest.raises(ApiException) as gone:
        client.read_namespaced_secret(secret_name, backend.namespace)
    assert gone.value.status == 404
    backend.ensure(spec)  # made again, with the pod
    assert client.read_namespaced_secret(secret_name, backend.namespace).data == secret.data
