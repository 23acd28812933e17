"""Sandboxes as pods in a dedicated Kubernetes namespace.

One pod per sandbox and one PersistentVolumeClaim for its workspace, both labelled with
the sandbox id and the deployment. The pod is built by a pure function
(`build_sandbox_pod`) so that every field that keeps it contained is tested without a
cluster. Its firewall is the Docker backend's script, run by an init container that has
NET_ADMIN and nothing else; the sandbox container starts as the sandbox user with no
capabilities and cannot change it. A second container, `quor-archive`, reads the
workspace with DAC_READ_SEARCH alone: the runtime's own archive (export_workspace).

Commands go over the exec WebSocket (v5: stdin can be closed), each on its own
ApiClient because `stream()` swaps the transport of the client it is given. The
command's limits and workspace transfers are shared with every backend (execution.py,
transfer.py): the control plane connects to the pod's address, as it does to a
container's.

A pod cannot be stopped and started again: stop deletes it and keeps the claim, and the
next ensure makes a new pod on the same workspace.
"""

import base64
import contextlib
import functools
import json
import os
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import kubernetes
from django.conf import settings
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException
from kubernetes.stream import stream
from kubernetes.stream.ws_client import V5_CHANNEL_PROTOCOL
from urllib3.exceptions import HTTPError as TransportError
from websocket import ABNF, WebSocketConnectionClosedException, WebSocketTimeoutException

from sandboxes.backends import channel, transfer
from sandboxes.backends.base import (
    BackendError,
    BackendUnavailable,
    RuntimeInstance,
    RuntimeMissing,
    RuntimeStatus,
    SandboxBackend,
    SandboxSpec,
    StartUpChecks,
    validate_spec,
)
from sandboxes.backends.execution import (
    STDERR,
    STDOUT,
    Execution,
    Start,
    run_bounded,
    stream_stdout,
)
from sandboxes.image import KEEP_ALIVE, SANDBOX_UID, WORKSPACE

LABEL_SANDBOX = "org.quor.sandbox-id"
LABEL_DEPLOYMENT = "org.quor.deployment"
COMPONENT_LABELS = {
    "app.kubernetes.io/managed-by": "quor",
    "app.kubernetes.io/component": "sandbox",
}
SANDBOX_CONTAINER = "sandbox"
FIREWALL_CONTAINER = "quor-firewall"
ARCHIVE_CONTAINER = "quor-archive"
EXEC_SECRET_KEY = "token"  # noqa: S105  (the key's name in the Secret, not a secret)
SERVICE_ACCOUNT = "quor-sandbox"
ENTRYPOINT = "/usr/local/bin/quor-sandbox-entrypoint"
RUN_DIR = "/run/quor"
READY_MARKER = f"{RUN_DIR}/firewall-ready"
PROXY_HOST_NAME = "quor-egress-proxy"
# Exec over WebSocket closes stdin only with v5 (Kubernetes 1.30); 1.37 is the newest
# version the pods and the chart are validated against.
MINIMUM_VERSION = (1, 30)
REST_TIMEOUT_S = (5, 30)
GONE_TIMEOUT_S = 60
FORCE_AFTER_S = 30
# Seconds a started sandbox container may take to start its exec channel.
CHANNEL_START_S = 10
# Seconds a command's stdin may take to be accepted before the exec counts as stuck.
EXEC_STDIN_TIMEOUT_S = 60
# Seconds a deleted pod's processes get to end (tini passes SIGTERM on) before SIGKILL.
DELETE_GRACE_S = 2
EXEC_STDIN_CHUNK = 128 * 1024
STDIN_CHANNEL, STATUS_CHANNEL = 0, 3
# Sidecar containers' fixed share, kept small: the firewall runs once, the archive
# container only reads.
SIDECAR_RESOURCES = {"cpu": "250m", "memory": "128Mi", "ephemeral-storage": "64Mi"}
# A first failed pull (ErrImagePull) may be passing; these are not.
IMAGE_UNAVAILABLE = {"ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName"}

version_checks = StartUpChecks()


@dataclass(frozen=True)
class PodPlacement:
    """What the deployment decides for every sandbox pod (from settings)."""

    namespace: str
    deployment: str
    proxy_address: str
    proxy_port: int
    control_plane_cidr: str
    ephemeral_storage: str
    node_selector: dict
    tolerations: list
    runtime_class: str
    image_pull_policy: str
    user_namespaces: bool


def placement_from_settings(proxy_address: str) -> PodPlacement:
    return PodPlacement(
        namespace=settings.QUOR_KUBERNETES_NAMESPACE,
        deployment=settings.QUOR_DEPLOYMENT,
        proxy_address=proxy_address,
        proxy_port=settings.QUOR_EGRESS_PROXY_PORT,
        control_plane_cidr=settings.QUOR_KUBERNETES_CONTROL_PLANE_CIDR,
        ephemeral_storage=settings.QUOR_KUBERNETES_EPHEMERAL_STORAGE,
        node_selector=settings.QUOR_KUBERNETES_NODE_SELECTOR,
        tolerations=settings.QUOR_KUBERNETES_TOLERATIONS,
        runtime_class=settings.QUOR_KUBERNETES_RUNTIME_CLASS,
        image_pull_policy=settings.QUOR_KUBERNETES_IMAGE_PULL_POLICY,
        user_namespaces=settings.QUOR_KUBERNETES_USER_NAMESPACES,
    )


def pod_name(deployment: str, sandbox_id: str) -> str:
    return f"quor-{deployment}-sandbox-{sandbox_id}"


def claim_name(deployment: str, sandbox_id: str) -> str:
    return f"quor-{deployment}-workspace-{sandbox_id}"


def exec_secret_name(deployment: str, sandbox_id: str) -> str:
    return f"quor-{deployment}-exec-{sandbox_id}"


def identity_labels(deployment: str, sandbox_id: str) -> dict[str, str]:
    return {**COMPONENT_LABELS, LABEL_DEPLOYMENT: deployment, LABEL_SANDBOX: sandbox_id}


def _restricted(*, user: int, add: tuple[str, ...] = ()) -> dict:
    """A container's security context: no privilege, every capability dropped but `add`,
    read-only root filesystem."""
    return {
        "runAsUser": user,
        "runAsGroup": user,
        "runAsNonRoot": user != 0,
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"], **({"add": list(add)} if add else {})},
    }


def build_sandbox_pod(spec: SandboxSpec, place: PodPlacement) -> dict:
    """The sandbox's pod. Pure: the same spec and placement give the same pod."""
    validate_spec(spec)
    ca_certificate = spec.environment.get("QUOR_EGRESS_CA_CERT", "")
    firewall_env = {
        "QUOR_PROXY_HOST": place.proxy_address,
        "QUOR_PROXY_PORT": str(place.proxy_port),
        "QUOR_CONTROL_PLANE_ADDR": place.control_plane_cidr,
    }
    sandbox_env = {
        **{k: v for k, v in spec.environment.items() if k != "QUOR_EGRESS_CA_CERT"},
        **firewall_env,
        "HOME": "/home/sandbox",
        "USER": "sandbox",
    }
    # From the pod's Secret, not written in the pod: whoever may read pods may not read it.
    exec_token = {
        "name": "QUOR_EXEC_TOKEN",
        "valueFrom": {
            "secretKeyRef": {
                "name": exec_secret_name(place.deployment, spec.sandbox_id),
                "key": EXEC_SECRET_KEY,
            }
        },
    }
    sandbox_limits = {
        "cpu": f"{round(spec.cpus * 1000)}m",
        "memory": str(spec.memory_bytes),
        "ephemeral-storage": place.ephemeral_storage,
    }
    pod_spec = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": DELETE_GRACE_S,
        "serviceAccountName": SERVICE_ACCOUNT,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "hostNetwork": False,
        "hostPID": False,
        "hostIPC": False,
        "shareProcessNamespace": False,
        "hostUsers": not place.user_namespaces,
        "hostname": "sandbox",
        "hostAliases": [{"ip": place.proxy_address, "hostnames": [PROXY_HOST_NAME]}],
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "initContainers": [
            {
                "name": FIREWALL_CONTAINER,
                "image": spec.image,
                "imagePullPolicy": place.image_pull_policy,
                # Owns the workspace's root for the sandbox user (a new volume's is
                # root's), then installs and verifies the firewall.
                "command": [
                    "/bin/sh",
                    "-c",
                    f'chown -h {SANDBOX_UID}:{SANDBOX_UID} {WORKSPACE} && exec {ENTRYPOINT} "$@"',
                    "sh",
                    "--firewall-only",
                ],
                "env": _env_list({**firewall_env, "QUOR_EGRESS_CA_CERT": ca_certificate}),
                "securityContext": _restricted(user=0, add=("NET_ADMIN", "CHOWN")),
                "resources": {"requests": SIDECAR_RESOURCES, "limits": SIDECAR_RESOURCES},
                "volumeMounts": [
                    {"name": "run", "mountPath": RUN_DIR},
                    {"name": "workspace", "mountPath": WORKSPACE},
                ],
            }
        ],
        "containers": [
            {
                "name": SANDBOX_CONTAINER,
                "image": spec.image,
                "imagePullPolicy": place.image_pull_policy,
                # The entrypoint's second stage: checks it has no privilege, starts the
                # exec channel, then becomes the keep-alive.
                "command": ["/usr/bin/tini", "--", ENTRYPOINT, "--quor-dropped", *KEEP_ALIVE],
                "workingDir": WORKSPACE,
                "env": [*_env_list(sandbox_env), exec_token],
                "securityContext": _restricted(user=SANDBOX_UID),
                "resources": {"requests": sandbox_limits, "limits": sandbox_limits},
                "volumeMounts": [
                    {"name": "workspace", "mountPath": WORKSPACE},
                    {"name": "tmp", "mountPath": "/tmp"},  # noqa: S108  (the sandbox's own)
                    {"name": "home", "mountPath": "/home/sandbox"},
                    {"name": "run", "mountPath": RUN_DIR, "readOnly": True},
                ],
            },
            {
                "name": ARCHIVE_CONTAINER,
                "image": spec.image,
                "imagePullPolicy": place.image_pull_policy,
                "command": ["/usr/bin/tini", "--", *KEEP_ALIVE],
                "securityContext": _restricted(user=0, add=("DAC_READ_SEARCH",)),
                "resources": {"requests": SIDECAR_RESOURCES, "limits": SIDECAR_RESOURCES},
                "volumeMounts": [{"name": "workspace", "mountPath": WORKSPACE, "readOnly": True}],
            },
        ],
        "volumes": [
            {
                "name": "workspace",
                "persistentVolumeClaim": {
                    "claimName": claim_name(place.deployment, spec.sandbox_id)
                },
            },
            {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
            {"name": "home", "emptyDir": {"sizeLimit": "512Mi"}},
            {"name": "run", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
        ],
    }
    if place.node_selector:
        pod_spec["nodeSelector"] = dict(place.node_selector)
    if place.tolerations:
        pod_spec["tolerations"] = list(place.tolerations)
    if place.runtime_class:
        pod_spec["runtimeClassName"] = place.runtime_class
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(place.deployment, spec.sandbox_id),
            "namespace": place.namespace,
            "labels": identity_labels(place.deployment, spec.sandbox_id),
        },
        "spec": pod_spec,
    }


def build_workspace_claim(
    sandbox_id: str, *, namespace: str, deployment: str, size: str, storage_class: str
) -> dict:
    """The sandbox's workspace: it outlives the pod (stop, wake, a lost node)."""
    claim_spec = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}
    if storage_class:
        claim_spec["storageClassName"] = storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": claim_name(deployment, sandbox_id),
            "namespace": namespace,
            "labels": identity_labels(deployment, sandbox_id),
        },
        "spec": claim_spec,
    }


def build_exec_secret(sandbox_id: str, *, namespace: str, deployment: str) -> dict:
    """The token of the pod's exec channel (`channel.channel_token` of the pod's name)."""
    token = channel.channel_token(pod_name(deployment, sandbox_id))
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": exec_secret_name(deployment, sandbox_id),
            "namespace": namespace,
            "labels": identity_labels(deployment, sandbox_id),
        },
        "type": "Opaque",
        "data": {EXEC_SECRET_KEY: base64.b64encode(token.encode()).decode()},
    }


def _env_list(environment: dict[str, str]) -> list[dict]:
    return [{"name": name, "value": value} for name, value in environment.items()]


def _unreachable(exc: Exception) -> BackendUnavailable:
    return BackendUnavailable(f"the Kubernetes API is not reachable: {exc}")


def _refused(exc: ApiException) -> BackendError:
    """An error answer; throttling or a restarting control plane is an outage."""
    try:
        message = json.loads(exc.body or "{}").get("message") or exc.reason
    except ValueError:
        message = exc.reason
    if exc.status in (429, 500, 502, 503, 504):
        return BackendUnavailable(f"the Kubernetes API answered {exc.status}: {message}")
    return BackendError(f"Kubernetes refused ({exc.status}): {message}")


def load_configuration() -> k8s.Configuration:
    """The API server and credentials: a kubeconfig file, or the pod's service account."""
    configuration = k8s.Configuration()
    try:
        if settings.QUOR_KUBERNETES_KUBECONFIG:
            kubernetes.config.load_kube_config(
                config_file=settings.QUOR_KUBERNETES_KUBECONFIG,
                client_configuration=configuration,
            )
        else:
            kubernetes.config.load_incluster_config(client_configuration=configuration)
    except (kubernetes.config.ConfigException, OSError) as exc:
        raise BackendUnavailable(f"no Kubernetes configuration: {exc}") from exc
    configuration.retries = 1
    return configuration


def check_server_version(git_version: str, major: str, minor: str) -> None:
    """Refuses a server older than MINIMUM_VERSION, saying why."""
    try:
        version = (int(major), int(minor.rstrip("+")))
    except ValueError:
        raise BackendError(f"cannot read the Kubernetes server's version {git_version!r}") from None
    if version < MINIMUM_VERSION:
        oldest = ".".join(map(str, MINIMUM_VERSION))
        raise BackendError(
            f"Kubernetes {git_version} is older than {oldest}, the oldest Quor supports: "
            "commands need the exec protocol v5.channel.k8s.io to close a command's stdin, "
            f"and the admission policy needs admissionregistration.k8s.io/v1 (both {oldest})."
        )


class KubernetesBackend(SandboxBackend):
    name = "kubernetes"

    def __init__(self):
        self.namespace = settings.QUOR_KUBERNETES_NAMESPACE
        self.deployment = settings.QUOR_DEPLOYMENT
        self._proxy_address = ""

    @functools.cached_property
    def configuration(self) -> k8s.Configuration:
        """Loaded at the first call: the egress proxy's pod, which has no credentials,
        asks a backend only where to listen."""
        return load_configuration()

    @functools.cached_property
    def api(self) -> k8s.ApiClient:
        return k8s.ApiClient(self.configuration)

    @functools.cached_property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.api)

    def check_version(self) -> None:
        """Raises BackendError for a server older than MINIMUM_VERSION."""
        info = self._request(k8s.VersionApi(self.api).get_code)
        check_server_version(info["gitVersion"], info["major"], info["minor"])

    def _check_version_once(self) -> None:
        version_checks.run_once(self.configuration.host, self.check_version)

    # --- the API ---------------------------------------------------------------------

    def _call(self, method, *args, **kwargs) -> dict:
        """The response as JSON; ApiException for a status other than 2xx."""
        self._check_version_once()
        return self._request(method, *args, **kwargs)

    def _request(self, method, *args, **kwargs) -> dict:
        try:
            response = method(
                *args, _preload_content=False, _request_timeout=REST_TIMEOUT_S, **kwargs
            )
            return json.loads(response.data or b"{}")
        except (TransportError, OSError) as exc:
            raise _unreachable(exc) from exc

    def _read(self, method, *args) -> dict | None:
        try:
            return self._call(method, *args)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise _refused(exc) from exc

    def _delete(self, method, name: str, grace_s: int = DELETE_GRACE_S) -> None:
        try:
            self._call(method, name, self.namespace, grace_period_seconds=grace_s)
        except ApiException as exc:
            if exc.status != 404:
                raise _refused(exc) from exc

    def _wait_gone(self, method, name: str, *, force=None) -> None:
        """Polls, more slowly as it goes. `force` deletes for good what is still there
        FORCE_AFTER_S after its deletion: a pod on a lost node, whose kubelet never
        confirms."""
        started, pause = time.monotonic(), 0.05
        while self._read(method, name, self.namespace) is not None:
            waited = time.monotonic() - started
            if force is not None and waited > FORCE_AFTER_S:
                force()
                force = None
            if waited > GONE_TIMEOUT_S:
                raise BackendError(f"{name} was still there {GONE_TIMEOUT_S} s after its deletion")
            time.sleep(pause)
            pause = min(pause * 2, 1.0)

    def _wait_pod_gone(self, name: str) -> None:
        def force():
            self._delete(self.core.delete_namespaced_pod, name, grace_s=0)

        self._wait_gone(self.core.read_namespaced_pod, name, force=force)

    def _labelled(self) -> str:
        return f"{LABEL_DEPLOYMENT}={self.deployment},app.kubernetes.io/managed-by=quor"

    def pod_name(self, sandbox_id: str) -> str:
        return pod_name(self.deployment, sandbox_id)

    def claim_name(self, sandbox_id: str) -> str:
        return claim_name(self.deployment, sandbox_id)

    # --- runtime -----------------------------------------------------------------------

    def ping(self) -> None:
        self._check_version_once()
        self._request(k8s.VersionApi(self.api).get_code)

    def egress_proxy_address(self) -> str:
        """The egress proxy Service's cluster IP, read once per backend."""
        if not self._proxy_address:
            namespace, _, name = settings.QUOR_KUBERNETES_EGRESS_SERVICE.partition("/")
            service = self._read(self.core.read_namespaced_service, name, namespace)
            if service is None:
                raise BackendError(
                    f"the egress proxy Service {settings.QUOR_KUBERNETES_EGRESS_SERVICE} "
                    "does not exist (QUOR_KUBERNETES_EGRESS_SERVICE)"
                )
            self._proxy_address = service["spec"]["clusterIP"]
        return self._proxy_address

    def egress_proxy_listen_address(self) -> str:
        """Every address of the proxy's pod: its Service sends sandboxes' traffic there,
        and the pod's address keeps the sandbox's (no NAT between pods)."""
        return "0.0.0.0"  # noqa: S104

    def image_ref(self, image: str) -> str:
        """The reference itself, compared with the one the pod asked for (the node reports
        it normalised, with its registry): a new QUOR_SANDBOX_IMAGE replaces the pods, a
        tag pushed again does not (use a new tag or a digest for every image)."""
        return image

    def ensure(self, spec: SandboxSpec) -> RuntimeStatus:
        place = placement_from_settings(self.egress_proxy_address())
        pod = build_sandbox_pod(spec, place)  # refuses an unsafe spec before anything exists
        name = pod["metadata"]["name"]
        current = self._read(self.core.read_namespaced_pod, name, self.namespace)
        if current is not None and _pod_ended(current):
            self.stop(spec.sandbox_id)  # an evicted, crashed or lost pod is not started again
            current = None
        elif current is not None and current["metadata"].get("deletionTimestamp"):
            self._wait_pod_gone(name)
            current = None
        self._ensure_claim(spec.sandbox_id)  # after the pod: a claim in use is not deleted
        if current is None:
            self._ensure_exec_secret(spec.sandbox_id)
            try:
                self._call(self.core.create_namespaced_pod, self.namespace, pod)
            except ApiException as exc:
                if exc.status != 409:  # 409: a concurrent ensure made it; wait for that one
                    raise _refused(exc) from exc
        running = self._wait_until_running(name)
        self._verify_firewall(spec.sandbox_id, running)
        return _status_of(running)

    def _ensure_exec_secret(self, sandbox_id: str) -> None:
        """Before the pod, which reads it at start. Its value depends only on the pod's
        name, so one left by an earlier pod (a stop that died half-way) is the same."""
        secret = build_exec_secret(sandbox_id, namespace=self.namespace, deployment=self.deployment)
        try:
            self._call(self.core.create_namespaced_secret, self.namespace, secret)
        except ApiException as exc:
            if exc.status != 409:
                raise _refused(exc) from exc

    def _ensure_claim(self, sandbox_id: str) -> None:
        claim = build_workspace_claim(
            sandbox_id,
            namespace=self.namespace,
            deployment=self.deployment,
            size=settings.QUOR_KUBERNETES_WORKSPACE_SIZE,
            storage_class=settings.QUOR_KUBERNETES_STORAGE_CLASS,
        )
        existing = self._read(
            self.core.read_namespaced_persistent_volume_claim,
            claim["metadata"]["name"],
            self.namespace,
        )
        if existing is not None and existing["metadata"].get("deletionTimestamp"):
            self._wait_gone(
                self.core.read_namespaced_persistent_volume_claim, claim["metadata"]["name"]
            )
            existing = None
        if existing is None:
            try:
                self._call(
                    self.core.create_namespaced_persistent_volume_claim, self.namespace, claim
                )
            except ApiException as exc:
                if exc.status != 409:
                    raise _refused(exc) from exc

    def _wait_until_running(self, name: str) -> dict:
        """Reads the pod, then watches it from that version until it runs; a watch whose
        version expired (410) reads again. Fails at once when the pod cannot run."""
        deadline = time.monotonic() + settings.QUOR_KUBERNETES_START_TIMEOUT
        while (remaining := deadline - time.monotonic()) > 0:
            pod = self._read(self.core.read_namespaced_pod, name, self.namespace)
            if pod is None:
                raise BackendError(f"the sandbox pod {name} was deleted while it started")
            if self._started(pod):
                return pod
            watch = kubernetes.watch.Watch()
            try:
                for event in watch.stream(
                    self.core.list_namespaced_pod,
                    self.namespace,
                    field_selector=f"metadata.name={name}",
                    resource_version=pod["metadata"]["resourceVersion"],
                    timeout_seconds=max(1, min(int(remaining), 30)),
                    _request_timeout=(REST_TIMEOUT_S[0], remaining + 10),
                ):
                    if event["type"] == "DELETED":
                        raise BackendError(f"the sandbox pod {name} was deleted while it started")
                    if self._started(event["raw_object"]):
                        return event["raw_object"]
            except ApiException as exc:
                if exc.status != 410:
                    raise _refused(exc) from exc
            except (TransportError, OSError) as exc:
                raise _unreachable(exc) from exc
            finally:
                watch.stop()
        raise BackendError(
            f"the sandbox pod {name} was not running after "
            f"{settings.QUOR_KUBERNETES_START_TIMEOUT} s (QUOR_KUBERNETES_START_TIMEOUT)"
        )

    def _started(self, pod: dict) -> bool:
        """Whether every container runs; raises when the pod can no longer get there."""
        status = pod.get("status") or {}
        if _pod_ended(pod):
            raise BackendError(f"the sandbox did not start: {self._why_it_ended(pod)}")
        every = (status.get("initContainerStatuses") or []) + (
            status.get("containerStatuses") or []
        )
        for container in every:
            waiting = (container.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in IMAGE_UNAVAILABLE:
                self._delete(self.core.delete_namespaced_pod, pod["metadata"]["name"])
                self._wait_pod_gone(pod["metadata"]["name"])
                raise BackendError(
                    f"the sandbox image {container.get('image', '')} is not available to the "
                    f"cluster: {waiting['reason']}: {waiting.get('message', '')}"
                )
        containers = status.get("containerStatuses") or []
        return (
            status.get("phase") == "Running"
            and not pod["metadata"].get("deletionTimestamp")
            and bool(containers)
            and all("running" in (c.get("state") or {}) for c in containers)
        )

    def _why_it_ended(self, pod: dict) -> str:
        """The firewall's own words when it refused to start; else the pod's reason."""
        status = pod.get("status") or {}
        for container in status.get("initContainerStatuses") or []:
            terminated = (container.get("state") or {}).get("terminated") or {}
            if terminated.get("exitCode"):
                return self._logs(pod["metadata"]["name"], container["name"]) or str(terminated)
        reason = f"{status.get('reason', '')} {status.get('message', '')}".strip()
        return f"{status.get('phase')}: {reason}"

    def _logs(self, name: str, container: str) -> str:
        try:
            response = self.core.read_namespaced_pod_log(
                name,
                self.namespace,
                container=container,
                tail_lines=20,
                _preload_content=False,
                _request_timeout=REST_TIMEOUT_S,
            )
        except (ApiException, TransportError, OSError):
            return ""
        return response.data.decode(errors="replace").strip()

    def _verify_firewall(self, sandbox_id: str, pod: dict) -> None:
        """The init container wrote the marker only after reading its rules back. Asked
        over the exec channel once it listens (the sandbox container starts it after its
        own checks), else through the API server."""
        name, argv = self.pod_name(sandbox_id), ["test", "-f", READY_MARKER]
        address, probe = _channel_address_of(pod), None
        deadline = time.monotonic() + CHANNEL_START_S
        while address and probe is None and time.monotonic() < deadline:
            try:
                probe = channel.run_over_channel(name, address, argv)
                channel.remember(name, address)
            except channel.ChannelUnavailable:
                time.sleep(0.01)
        if probe is None:
            probe = run_bounded(
                self._exec_starter(sandbox_id, SANDBOX_CONTAINER), argv, cwd="/", env={},
                timeout_s=10, output_limit=1024,
            )  # fmt: skip
        if probe.exit_code != 0:
            raise BackendError("the sandbox pod runs without its firewall marker")

    def status(self, sandbox_id: str) -> RuntimeStatus:
        pod = self._read(self.core.read_namespaced_pod, self.pod_name(sandbox_id), self.namespace)
        if pod is None:
            return RuntimeStatus(exists=False, detail="absent")
        return _status_of(pod)

    def stop(self, sandbox_id: str) -> None:
        """Deletes the pod (a pod does not restart), then its exec token; the workspace
        claim stays."""
        name = self.pod_name(sandbox_id)
        self._delete(self.core.delete_namespaced_pod, name)
        self._wait_pod_gone(name)
        secret = exec_secret_name(self.deployment, sandbox_id)
        self._delete(self.core.delete_namespaced_secret, secret, grace_s=0)

    def destroy(self, sandbox_id: str, *, remove_workspace: bool) -> None:
        self.stop(sandbox_id)
        if remove_workspace:
            name = self.claim_name(sandbox_id)
            self._delete(self.core.delete_namespaced_persistent_volume_claim, name)
            self._wait_gone(self.core.read_namespaced_persistent_volume_claim, name)

    def list_instances(self) -> list[RuntimeInstance]:
        pods = self._list(self.core.list_namespaced_pod)
        return [
            RuntimeInstance(
                sandbox_id=pod["metadata"]["labels"].get(LABEL_SANDBOX, ""),
                runtime_id=pod["metadata"]["uid"],
                running=_status_of(pod).running,
            )
            for pod in pods
        ]

    def list_workspaces(self) -> list[str]:
        claims = self._list(self.core.list_namespaced_persistent_volume_claim)
        return [claim["metadata"]["labels"].get(LABEL_SANDBOX, "") for claim in claims]

    def _list(self, method) -> list[dict]:
        try:
            return self._call(method, self.namespace, label_selector=self._labelled())["items"]
        except ApiException as exc:
            raise _refused(exc) from exc

    def workspace_exists(self, sandbox_id: str) -> bool:
        claim = self._read(
            self.core.read_namespaced_persistent_volume_claim,
            self.claim_name(sandbox_id),
            self.namespace,
        )
        return claim is not None and not claim["metadata"].get("deletionTimestamp")

    # --- exec ----------------------------------------------------------------------------

    def exec(self, sandbox_id, argv, **limits_and_place):
        return run_bounded(self._starter(sandbox_id), argv, **limits_and_place)

    def _starter(self, sandbox_id: str) -> Start:
        """Starts commands in the sandbox container: over its exec channel, or through
        the API server's exec when it has none."""
        name = self.pod_name(sandbox_id)
        return channel.starter(
            name,
            lambda: self._channel_address(name),
            self._exec_starter(sandbox_id, SANDBOX_CONTAINER),
        )

    def _channel_address(self, name: str) -> str | None:
        pod = self._read(self.core.read_namespaced_pod, name, self.namespace)
        return None if pod is None else _channel_address_of(pod)

    def _exec_starter(self, sandbox_id: str, container: str) -> Start:
        """Starts commands in one of the pod's containers through the API server's exec
        (execution.Start). Exec has no working directory or environment of its own:
        `env -C` sets both (so a command whose name has a `=` in it would be taken for a
        variable)."""
        name = self.pod_name(sandbox_id)

        def start(argv, *, cwd, env, stdin) -> Execution:
            command = ["env", "-C", cwd, "--", *(f"{k}={v}" for k, v in env.items()), *argv]
            return _KubernetesExecution(self._open_exec(name, container, command, stdin))

        return start

    def _open_exec(self, name: str, container: str, command: list[str], with_stdin: bool):
        self._check_version_once()
        api = k8s.CoreV1Api(k8s.ApiClient(self.configuration))
        try:
            return stream(
                api.connect_get_namespaced_pod_exec,
                name,
                self.namespace,
                command=command,
                container=container,
                stdin=with_stdin,
                stdout=True,
                stderr=True,
                tty=False,
                binary=True,
                _preload_content=False,
            )
        except ApiException as exc:
            # The WebSocket client reports the handshake's status only in its message.
            handshake = re.search(r"Handshake status (\d{3})", str(exc.reason))
            status = int(handshake[1]) if handshake else exc.status
            if status in (400, 404):
                raise RuntimeMissing(f"sandbox pod {name} is not running") from None
            if status == 0:
                raise _unreachable(exc) from exc
            raise _refused(ApiException(status=status, reason=str(exc.reason))) from exc

    def exec_stream(self, sandbox_id, argv, *, cwd) -> Iterator[bytes]:
        yield from stream_stdout(self._starter(sandbox_id), argv, cwd=cwd)

    # --- workspace streams (snapshots) ---------------------------------------------------

    def export_workspace(self, sandbox_id: str, path: str = ".") -> Iterator[bytes]:
        """Read by `tar` in the archive container (DAC_READ_SEARCH, the workspace
        read-only): what the sandbox user locked away is in it too."""
        target = os.path.normpath(os.path.join(WORKSPACE, path))
        if target != WORKSPACE and not target.startswith(WORKSPACE + "/"):
            raise BackendError(f"{path} is outside the workspace")
        argv = ["tar", "-c", "-C", os.path.dirname(target), "-f", "-", os.path.basename(target)]
        if target == WORKSPACE:
            argv = ["tar", "-c", "-C", WORKSPACE, "-f", "-", "."]
        return stream_stdout(
            self._exec_starter(sandbox_id, ARCHIVE_CONTAINER),
            argv,
            cwd="/",
            failure=transfer.tar_failed,
        )

    def export_workspace_as_sandbox_user(
        self, sandbox_id: str, *, excluded: str
    ) -> Iterator[bytes]:
        address = self._running_address(sandbox_id)
        yield from transfer.send_workspace(self._starter(sandbox_id), address, excluded=excluded)

    def import_workspace(self, sandbox_id: str, tar_stream: Iterable[bytes]) -> None:
        address = self._running_address(sandbox_id)
        transfer.receive_workspace(self._starter(sandbox_id), address, tar_stream)

    def _running_address(self, sandbox_id: str) -> str:
        status = self.status(sandbox_id)
        if not status.running:
            raise RuntimeMissing(f"sandbox {sandbox_id} has no running pod")
        return status.network_address


def _channel_address_of(pod: dict) -> str | None:
    """None for a pod that is not running or has no channel."""
    sandbox = next(c for c in pod["spec"]["containers"] if c["name"] == SANDBOX_CONTAINER)
    with_token = any(item["name"] == "QUOR_EXEC_TOKEN" for item in sandbox.get("env") or ())
    return (_status_of(pod).network_address or None) if with_token else None


def _sandbox_container_state(pod: dict) -> dict:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    own = next((c for c in statuses if c["name"] == SANDBOX_CONTAINER), {})
    return own.get("state") or {}


def _pod_ended(pod: dict) -> bool:
    """Failed or done, or its sandbox container ended (the pod's phase stays Running
    while the archive container runs)."""
    phase = (pod.get("status") or {}).get("phase")
    ended = ("Failed", "Succeeded", "Unknown")  # Unknown: its node stopped answering
    return phase in ended or "terminated" in _sandbox_container_state(pod)


def _status_of(pod: dict) -> RuntimeStatus:
    status = pod.get("status") or {}
    running = (
        status.get("phase") == "Running"
        and "running" in _sandbox_container_state(pod)
        and not pod["metadata"].get("deletionTimestamp")
    )
    sandbox = next(c for c in pod["spec"]["containers"] if c["name"] == SANDBOX_CONTAINER)
    detail = status.get("phase", "Pending")
    if status.get("reason"):
        detail = f"{detail}: {status['reason']}"
    return RuntimeStatus(
        exists=True,
        running=running,
        runtime_id=pod["metadata"].get("uid", ""),
        image_ref=sandbox.get("image", ""),
        network_address=status.get("podIP", "") if running else "",
        detail=detail,
    )


class _KubernetesExecution:
    """A command started over the exec WebSocket: stdin on channel 0 (closed with the v5
    close frame), output on channels 1 and 2, the exit status on channel 3.

    Frames are read from the WebSocket itself: the client's own reader reads on inside
    its channel accessors, keeps a copy of all output, and drops what a reset of that
    copy catches in between."""

    def __init__(self, ws):
        self.ws = ws
        self.status = b""

    def send_stdin(self, chunks: Iterable[bytes]) -> None:
        if self.ws.subprotocol != V5_CHANNEL_PROTOCOL:  # v4 cannot close stdin
            raise BackendError("the Kubernetes API did not offer exec v5: stdin cannot end")
        self.ws.sock.settimeout(EXEC_STDIN_TIMEOUT_S)
        for chunk in chunks:
            for start in range(0, len(chunk), EXEC_STDIN_CHUNK):
                self.ws.write_stdin(chunk[start : start + EXEC_STDIN_CHUNK])
        self.ws.close_channel(STDIN_CHANNEL)

    def output(self, read_timeout: float) -> Iterator[tuple[int, bytes]]:
        self.ws.sock.settimeout(read_timeout)
        while True:
            try:
                opcode, frame = self.ws.sock.recv_data_frame(True)
            except WebSocketTimeoutException:
                raise TimeoutError(f"the command was silent for {read_timeout:g} s") from None
            except WebSocketConnectionClosedException:
                return
            if opcode == ABNF.OPCODE_CLOSE:
                return
            if opcode not in (ABNF.OPCODE_BINARY, ABNF.OPCODE_TEXT) or not frame.data:
                continue
            data = frame.data if isinstance(frame.data, bytes) else frame.data.encode()
            channel, payload = data[0], data[1:]
            if channel in (STDOUT, STDERR) and payload:
                yield channel, payload
            elif channel == STATUS_CHANNEL:
                self.status += payload

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ws.close()

    def exit_code(self) -> int:
        """From the Status on channel 3: Success, or the ExitCode cause."""
        try:
            status = json.loads(self.status or b"{}")
        except ValueError:
            status = {}
        if status.get("status") == "Success":
            return 0
        for cause in (status.get("details") or {}).get("causes") or []:
            if cause.get("reason") == "ExitCode":
                return int(cause["message"])
        raise BackendError(f"the command ended without an exit status: {status.get('message', '')}")
