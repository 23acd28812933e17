"""The backends the contract suite runs against, and how a test drives each one's engine
from outside (what an operator, a host restart or an outage would do)."""

import os
import time
import uuid
from pathlib import Path

import pytest
from django.conf import settings
from django.test import override_settings

from sandboxes.backends.base import SandboxSpec, StartUpChecks
from sandboxes.backends.memory import MemoryBackend

MISSING_DOCKER_SOCKET = "unix:///nonexistent/quor-test/docker.sock"


class MemoryEngine:
    name = "memory"
    # Commands run as uid 1000 only when the tests run as root (memory.py).
    runs_as_sandbox_user = os.geteuid() == 0

    def backend(self):
        return MemoryBackend()

    def unreachable_backend(self, monkeypatch):
        """A backend made while its engine was there, which then went away."""
        backend = MemoryBackend()
        monkeypatch.setattr(MemoryBackend, "unreachable", True)
        return backend

    def lose_runtime(self, sandbox_id):
        MemoryBackend.lose_runtime(sandbox_id)

    def close(self):
        MemoryBackend.reset()


class DockerEngine:
    name = "docker"
    runs_as_sandbox_user = True

    def backend(self):
        from sandboxes.backends.docker import DockerBackend

        return DockerBackend()

    def unreachable_backend(self, monkeypatch):
        """A backend pointed at a Docker socket that does not exist."""
        from sandboxes.backends.docker import DockerBackend

        monkeypatch.setenv("DOCKER_HOST", MISSING_DOCKER_SOCKET)
        return DockerBackend()

    def lose_runtime(self, sandbox_id):
        import docker

        backend = self.backend()
        docker.from_env().containers.get(backend.container_name(sandbox_id)).remove(force=True)

    def close(self):
        pass


class KubernetesEngine:
    """The Kubernetes backend against the fake API server (tests/kubernetes_api.py), which
    runs each pod's containers on the local Docker Engine, on the sandbox bridge: the egress
    proxy's Service has the bridge's gateway as its cluster IP, as the host is there.

    With `cluster_kubeconfig` (QUOR_TEST_KUBECONFIG for the contract suite), against that
    real cluster instead (docs/deploy-kubernetes.md, "Checking a cluster")."""

    name = "kubernetes"
    runs_as_sandbox_user = True

    def __init__(self, tmp_path, cluster_kubeconfig: str | None = None):
        from sandboxes.backends.docker import DockerBackend, sandbox_network_gateway
        from tests.kubernetes_api import FakeKubernetes

        self.fake = None
        if cluster_kubeconfig:
            self.kubeconfig = cluster_kubeconfig
            control_plane = os.environ["QUOR_TEST_KUBERNETES_CONTROL_PLANE_CIDR"]
        else:
            self.fake = FakeKubernetes(docker_network=DockerBackend().ensure_network().name)
            self.fake.start()
            gateway = sandbox_network_gateway()
            namespace, _, service = settings.QUOR_KUBERNETES_EGRESS_SERVICE.partition("/")
            self.fake.add_service(namespace, service, gateway, [settings.QUOR_EGRESS_PROXY_PORT])
            self.kubeconfig = self.fake.write_kubeconfig(tmp_path / "kubeconfig")
            control_plane = f"{gateway}/32"
        server = load_configuration_of(self.kubeconfig).host
        self.dead_kubeconfig = tmp_path / "unreachable-kubeconfig"
        self.dead_kubeconfig.write_text(
            Path(self.kubeconfig).read_text().replace(server, DEAD_SERVER)
        )
        self.settings = override_settings(
            QUOR_KUBERNETES_KUBECONFIG=self.kubeconfig,
            QUOR_KUBERNETES_CONTROL_PLANE_CIDR=control_plane,
        )
        self.settings.enable()

    def backend(self):
        from sandboxes.backends.kubernetes import KubernetesBackend

        return KubernetesBackend()

    def unreachable_backend(self, monkeypatch):
        """A backend whose API server answered once (its version was checked), then went
        away."""
        from sandboxes.backends import kubernetes

        monkeypatch.setattr(settings, "QUOR_KUBERNETES_KUBECONFIG", str(self.dead_kubeconfig))
        monkeypatch.setattr(kubernetes, "version_checks", StartUpChecks([DEAD_SERVER]))
        return kubernetes.KubernetesBackend()

    def lose_runtime(self, sandbox_id):
        """An operator deletes the pod with the API, as kubectl would."""
        from kubernetes import client, config

        api = client.CoreV1Api(config.new_client_from_config(config_file=self.kubeconfig))
        backend = self.backend()
        api.delete_namespaced_pod(backend.pod_name(sandbox_id), backend.namespace)
        deadline = time.monotonic() + 60
        while backend.status(sandbox_id).exists:
            assert time.monotonic() < deadline, "the deleted pod never went away"
            time.sleep(0.05)

    def close(self):
        self.settings.disable()
        if self.fake:
            self.fake.stop()


def load_configuration_of(kubeconfig: str):
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    return configuration


DEAD_SERVER = "http://127.0.0.1:9"  # the discard port: nothing listens there
ENGINES = {"memory": MemoryEngine, "docker": DockerEngine, "kubernetes": KubernetesEngine}


@pytest.fixture(
    scope="module",
    params=[
        "memory",
        pytest.param("docker", marks=pytest.mark.docker),
        pytest.param("kubernetes", marks=pytest.mark.docker),
    ],
)
def engine(request, tmp_path_factory):
    if request.param == "kubernetes":
        cluster = os.environ.get("QUOR_TEST_KUBECONFIG")
        engine = KubernetesEngine(tmp_path_factory.mktemp("kubernetes"), cluster)
    else:
        engine = ENGINES[request.param]()
    yield engine
    engine.close()


def new_spec(**fields) -> SandboxSpec:
    """A small sandbox with a new id (a UUID, as Quor's are), on the deployment's image."""
    return SandboxSpec(
        sandbox_id=str(uuid.uuid4()),
        image=settings.QUOR_SANDBOX_IMAGE,
        cpus=1.0,
        memory_bytes=512 * 1024 * 1024,
        pids_limit=256,
        **fields,
    )


@pytest.fixture(scope="module")
def shared(engine):
    """One running sandbox for every test that leaves it running: (backend, spec)."""
    backend, spec = engine.backend(), new_spec()
    backend.ensure(spec)
    yield backend, spec
    backend.destroy(spec.sandbox_id, remove_workspace=True)


@pytest.fixture
def fresh(engine):
    """Starts new sandboxes of the test's own, removed (with their workspaces) after it:
    `fresh()` gives (backend, spec)."""
    backend, made = engine.backend(), []

    def start():
        spec = new_spec()
        made.append(spec.sandbox_id)
        backend.ensure(spec)
        return backend, spec

    yield start
    for sandbox_id in made:
        backend.destroy(sandbox_id, remove_workspace=True)
