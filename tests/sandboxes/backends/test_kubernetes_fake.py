"""The fake Kubernetes API server (tests/kubernetes_api.py) driven by the official client,
so these tests also show that its wire format is the one the client reads: REST objects
and Status errors, selectors, watches and their 410, the exec WebSocket, and pods run on
the local Docker Engine as a kubelet would run them."""

import hashlib
import json
import os
import threading
import time
import uuid

import docker
import kubernetes
import kubernetes_validate
import pytest
import requests.sessions
from django.conf import settings
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException
from kubernetes.stream import stream

from tests import environment
from tests.kubernetes_api import LABEL, FakeKubernetes

pytestmark = pytest.mark.docker

MISSING_IMAGE = "quor-fake-kubernetes-missing:1"


def wait_for(read, accept, timeout=30):
    """read() until accept(value), or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if accept(value):
            return value
        assert time.monotonic() < deadline, f"still {value!r} after {timeout} s"
        time.sleep(0.05)


def body_of(exc: ApiException) -> dict:
    return json.loads(exc.body)


@pytest.fixture(scope="module")
def engine():
    client = docker.from_env()
    name = f"quor-fake-k8s-{environment.NAME}"  # this worker's: a killed run's goes first
    for leftover in client.networks.list(names=[name], greedy=True):
        if leftover.name == name:
            for container in leftover.containers:
                container.remove(force=True)
            leftover.remove()
    network = client.networks.create(name, driver="bridge", internal=True)
    fake = FakeKubernetes(docker_network=name)
    fake.start()
    yield fake, client
    fake.stop()
    network.remove()
    assert not client.containers.list(all=True, filters={"label": f"{LABEL}={fake.instance}"})
    assert not client.volumes.list(filters={"label": f"{LABEL}={fake.instance}"})
    assert not fake.errors


@pytest.fixture(scope="module")
def fake(engine):
    return engine[0]


@pytest.fixture(scope="module")
def configuration(fake, tmp_path_factory):
    path = fake.write_kubeconfig(tmp_path_factory.mktemp("kube") / "config")
    configuration = k8s.Configuration()
    kubernetes.config.load_kube_config(path, client_configuration=configuration)
    return configuration


@pytest.fixture(scope="module")
def api(configuration):
    return k8s.CoreV1Api(k8s.ApiClient(configuration))


@pytest.fixture
def namespace():
    return f"t-{uuid.uuid4().hex[:8]}"


def container(name, command, **fields):
    return {"name": name, "image": settings.QUOR_SANDBOX_IMAGE, "command": command, **fields}


def pod_manifest(name, containers, **spec):
    labels = spec.pop("labels", {})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 1,
            "containers": containers,
            **spec,
        },
    }


def waiting_pod(name, **labels):
    """A pod whose image is not there: it is stored and scheduled, nothing runs."""
    image = {"image": MISSING_IMAGE, "imagePullPolicy": "Never"}
    return pod_manifest(name, [container("main", ["true"], **image)], labels=labels)


def claim_manifest(name, **labels):
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }


def read_pod(api, namespace, name) -> dict:
    return api.api_client.sanitize_for_serialization(api.read_namespaced_pod(name, namespace))


def phase_of(api, namespace, name) -> str:
    return api.read_namespaced_pod(name, namespace).status.phase


def state_of(status: dict, name: str) -> dict:
    kinds = ("initContainerStatuses", "containerStatuses")
    states = (s["state"] for kind in kinds for s in status.get(kind) or [] if s["name"] == name)
    return next(states, {})


def run_in(configuration, namespace, pod, argv, *, container="main", stdin=None, headers=None):
    """One exec on a client of its own: (stdout, stderr, the Status of channel 3, client)."""
    ws = stream(
        k8s.CoreV1Api(k8s.ApiClient(configuration)).connect_get_namespaced_pod_exec,
        pod,
        namespace,
        command=argv,
        container=container,
        stdin=stdin is not None,
        stdout=True,
        stderr=True,
        tty=False,
        binary=True,
        _preload_content=False,
        **({"_headers": headers} if headers else {}),
    )
    if stdin is not None:
        for start in range(0, len(stdin), 128 * 1024):
            ws.write_stdin(stdin[start : start + 128 * 1024])
        ws.close_channel(0)
    out, err = bytearray(), bytearray()
    deadline = time.monotonic() + 60
    while ws.is_open() and time.monotonic() < deadline:
        ws.update(timeout=1)
        out += ws.read_channel(1)
        err += ws.read_channel(2)  # (may read further frames: the next round takes them)
    assert not ws.is_open(), "the exec did not end"
    out += ws.read_channel(1)
    err += ws.read_channel(2)
    return bytes(out), bytes(err), json.loads(ws.peek_channel(3)), ws


# --- the API ----------------------------------------------------------------------------------


def test_version_and_discovery_are_those_of_the_configured_release(configuration, api):
    version = k8s.VersionApi(k8s.ApiClient(configuration)).get_code()
    assert (version.major, version.minor, version.git_version) == ("1", "33", "v1.33.0")
    assert k8s.CoreApi(api.api_client).get_api_versions().versions == ["v1"]
    resources = {r.name for r in api.get_api_resources().resources}
    assert {"pods", "pods/exec", "pods/log", "persistentvolumeclaims", "services"} <= resources


def test_a_request_without_the_token_gets_a_401_status(fake, api, namespace):
    anonymous = k8s.Configuration(host=fake.url)
    with pytest.raises(ApiException) as raised:
        k8s.CoreV1Api(k8s.ApiClient(anonymous)).list_namespaced_pod(namespace)
    assert raised.value.status == 401
    assert body_of(raised.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "Unauthorized",
        "reason": "Unauthorized",
        "code": 401,
    }
    api.list_namespaced_pod(namespace)
    assert ("GET", f"/api/v1/namespaces/{namespace}/pods") in fake.requests


def test_what_the_fake_does_not_serve_fails_with_404_and_405_statuses(api, namespace):
    with pytest.raises(ApiException) as raised:
        api.list_namespaced_config_map(namespace)
    assert raised.value.status == 404
    assert body_of(raised.value)["reason"] == "NotFound"
    api.create_namespaced_pod(namespace, waiting_pod("p"))
    with pytest.raises(ApiException) as raised:
        api.patch_namespaced_pod("p", namespace, {"metadata": {"labels": {"a": "b"}}})
    assert raised.value.status == 405
    assert body_of(raised.value)["reason"] == "MethodNotAllowed"


def test_errors_are_the_status_bodies_of_a_real_server(api, namespace):
    with pytest.raises(ApiException) as raised:
        api.read_namespaced_pod("absent", namespace)
    assert raised.value.status == 404
    assert body_of(raised.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'pods "absent" not found',
        "reason": "NotFound",
        "details": {"name": "absent", "kind": "pods"},
        "code": 404,
    }

    api.create_namespaced_pod(namespace, waiting_pod("twice"))
    with pytest.raises(ApiException) as raised:
        api.create_namespaced_pod(namespace, waiting_pod("twice"))
    assert raised.value.status == 409
    assert body_of(raised.value)["reason"] == "AlreadyExists"
    assert body_of(raised.value)["message"] == 'pods "twice" already exists'

    with pytest.raises(ApiException) as raised:
        api.create_namespaced_pod(namespace, waiting_pod("Not_A_Name"))
    invalid = body_of(raised.value)
    assert (raised.value.status, invalid["reason"]) == (422, "Invalid")
    assert invalid["details"]["kind"] == "Pod"
    assert invalid["details"]["causes"][0]["field"] == "metadata.name"
    assert invalid["message"].startswith(
        'Pod "Not_A_Name" is invalid: metadata.name: Invalid value'
    )

    with pytest.raises(ApiException) as raised:
        api.create_namespaced_pod(namespace, waiting_pod("long-label", app="x" * 64))
    assert raised.value.status == 422
    assert "must be no more than 63 characters" in body_of(raised.value)["message"]

    with pytest.raises(ApiException) as raised:
        api.create_namespaced_pod(
            namespace, {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}}
        )
    assert (raised.value.status, body_of(raised.value)["reason"]) == (400, "BadRequest")


def test_a_pod_field_the_fake_does_not_model_is_refused_not_ignored(api, namespace):
    pod = waiting_pod("host")
    pod["spec"]["volumes"] = [{"name": "root", "hostPath": {"path": "/"}}]
    pod["spec"]["hostPID"] = True
    with pytest.raises(ApiException) as raised:
        api.create_namespaced_pod(namespace, pod)
    fields = {c["field"] for c in body_of(raised.value)["details"]["causes"]}
    assert raised.value.status == 422
    assert fields == {"spec.volumes[0].hostPath", "spec.hostPID"}
    pod = waiting_pod("probe")
    pod["spec"]["containers"][0]["readinessProbe"] = {"exec": {"command": ["true"]}}
    with pytest.raises(ApiException) as raised:
        api.create_namespaced_pod(namespace, pod)
    assert "not modelled by the fake" in body_of(raised.value)["message"]


def test_a_pod_is_stored_with_the_servers_defaults_and_valid_for_its_version(api, namespace):
    created = api.create_namespaced_pod(namespace, waiting_pod("defaults"))
    assert created.status.phase == "Pending"
    assert created.metadata.uid and created.metadata.resource_version
    container = created.spec.containers[0]
    assert (container.termination_message_path, created.spec.dns_policy) == (
        "/dev/termination-log",
        "ClusterFirst",
    )
    pod = wait_for(
        lambda: read_pod(api, namespace, "defaults"),
        lambda p: (
            state_of(p["status"], "main").get("waiting", {}).get("reason") == "ErrImageNeverPull"
        ),
    )
    assert pod["status"]["phase"] == "Pending"
    assert pod["spec"]["nodeName"]
    kubernetes_validate.validate(pod, "1.33", strict=True)


def test_label_and_field_selectors_filter_lists(api, namespace):
    api.create_namespaced_pod(namespace, waiting_pod("one", app="web", tier="a"))
    api.create_namespaced_pod(namespace, waiting_pod("two", app="web"))
    api.create_namespaced_pod(namespace, waiting_pod("three", app="db"))

    def names(**selectors):
        return sorted(
            p.metadata.name for p in api.list_namespaced_pod(namespace, **selectors).items
        )

    assert names() == ["one", "three", "two"]
    assert names(label_selector="app=web") == ["one", "two"]
    assert names(label_selector="app=web,tier=a") == ["one"]
    assert names(label_selector="app!=web") == ["three"]
    assert names(label_selector="tier") == ["one"]
    assert names(label_selector="!tier") == ["three", "two"]
    assert names(label_selector="app in (db, cache)") == ["three"]
    assert names(field_selector="metadata.name=two") == ["two"]
    listed = api.list_namespaced_pod(namespace, limit=2)
    assert len(listed.items) == 2 and listed.metadata._continue
    rest = api.list_namespaced_pod(namespace, limit=2, _continue=listed.metadata._continue)
    assert [p.metadata.name for p in rest.items] == ["two"]
    assert int(listed.metadata.resource_version) >= max(
        int(p.metadata.resource_version) for p in listed.items
    )
    with pytest.raises(ApiException) as raised:
        api.list_namespaced_pod(namespace, field_selector="spec.foo=bar")
    assert raised.value.status == 400
    assert body_of(raised.value)["message"] == "field label not supported: spec.foo"


def test_a_watch_replays_what_happened_after_its_version_then_ends_at_its_timeout(api, namespace):
    since = api.list_namespaced_pod(namespace).metadata.resource_version
    api.create_namespaced_pod(namespace, waiting_pod("watched"))
    api.delete_namespaced_pod("watched", namespace, grace_period_seconds=1)
    wait_for(
        lambda: [p.metadata.name for p in api.list_namespaced_pod(namespace).items], lambda n: not n
    )

    watch = kubernetes.watch.Watch()
    started = time.monotonic()
    events = list(
        watch.stream(api.list_namespaced_pod, namespace, resource_version=since, timeout_seconds=1)
    )
    assert 1 <= time.monotonic() - started < 5
    kinds = [e["type"] for e in events]
    assert kinds[0] == "ADDED" and kinds[-1] == "DELETED" and "MODIFIED" in kinds
    versions = [int(e["object"].metadata.resource_version) for e in events]
    assert versions == sorted(versions) and versions[0] > int(since)


def test_a_watch_from_an_expired_version_gets_410_expired(fake, api, namespace):
    since = api.list_namespaced_pod(namespace).metadata.resource_version
    api.create_namespaced_pod(namespace, waiting_pod("before"))
    fake.expire_watch_history()
    with pytest.raises(ApiException) as raised:
        list(
            kubernetes.watch.Watch().stream(
                api.list_namespaced_pod, namespace, resource_version=since, timeout_seconds=5
            )
        )
    assert raised.value.status == 410
    assert raised.value.reason.startswith("Expired: too old resource version")
    now = api.list_namespaced_pod(namespace).metadata.resource_version
    events = kubernetes.watch.Watch().stream(
        api.list_namespaced_pod, namespace, resource_version=now, timeout_seconds=1
    )
    # From a current version: no 410, only what happens next (the kubelet may still be
    # updating the pod's status).
    assert {event["type"] for event in events} <= {"MODIFIED"}


def test_a_services_cluster_ip_and_ports_are_readable(fake, api, namespace):
    fake.add_service(namespace, "proxy", "10.96.0.20", [8899])
    service = api.read_namespaced_service("proxy", namespace)
    assert service.spec.cluster_ip == "10.96.0.20"
    assert [p.port for p in service.spec.ports] == [8899]
    with pytest.raises(ApiException) as raised:
        api.read_namespaced_service("absent", namespace)
    assert raised.value.status == 404


def test_a_claim_is_bound_to_a_docker_volume_kept_until_it_is_deleted(engine, api, namespace):
    fake, client = engine
    created = api.create_namespaced_persistent_volume_claim(
        namespace, claim_manifest("ws", app="q")
    )
    assert created.status.phase == "Pending"
    bound = wait_for(
        lambda: api.read_namespaced_persistent_volume_claim("ws", namespace),
        lambda c: c.status.phase == "Bound",
    )
    assert bound.status.capacity == {"storage": "1Gi"}
    assert bound.metadata.finalizers == ["kubernetes.io/pvc-protection"]
    listed = api.list_namespaced_persistent_volume_claim(namespace, label_selector="app=q")
    assert [c.metadata.name for c in listed.items] == ["ws"]
    volumes = client.volumes.list(
        filters={"label": [f"{LABEL}={fake.instance}", f"{LABEL}.claim=ws"]}
    )
    assert len(volumes) == 1
    with pytest.raises(ApiException) as raised:
        api.create_namespaced_persistent_volume_claim(namespace, claim_manifest("ws"))
    assert raised.value.status == 409
    unsized = claim_manifest("unsized")
    del unsized["spec"]["resources"]
    with pytest.raises(ApiException) as raised:
        api.create_namespaced_persistent_volume_claim(namespace, unsized)
    assert body_of(raised.value)["details"]["causes"][0]["field"] == "spec.resources[storage]"

    api.delete_namespaced_persistent_volume_claim("ws", namespace)
    wait_for(
        lambda: api.list_namespaced_persistent_volume_claim(namespace).items,
        lambda items: not items,
    )
    with pytest.raises(docker.errors.NotFound):
        client.volumes.get(volumes[0].name)


# --- pods on Docker -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def running(engine, api):
    """A pod like a sandbox's, made before its claim exists: (namespace, name)."""
    namespace, name = f"t-{uuid.uuid4().hex[:8]}", "sandbox-pod"
    mounts = [
        {"name": "run", "mountPath": "/run/x", "readOnly": True},
        {"name": "ws", "mountPath": "/w"},
        {"name": "scratch", "mountPath": "/t"},
    ]
    pod = pod_manifest(
        name,
        [
            container(
                "main",
                ["/usr/bin/tini", "--", "sleep", "infinity"],
                workingDir="/w",
                env=[{"name": "GREETING", "value": "hello"}],
                securityContext={
                    "runAsUser": 1000,
                    "runAsGroup": 1000,
                    "allowPrivilegeEscalation": False,
                    "readOnlyRootFilesystem": True,
                    "capabilities": {"drop": ["ALL"]},
                },
                resources={"limits": {"cpu": "500m", "memory": "256Mi"}},
                volumeMounts=mounts,
            ),
            container("second", ["/usr/bin/tini", "--", "sleep", "infinity"]),
        ],
        initContainers=[
            container(
                "setup",
                ["sh", "-c", "echo ready > /run/x/marker && chown 1000:1000 /w && echo set up"],
                securityContext={"runAsUser": 0},
                volumeMounts=[
                    {"name": "run", "mountPath": "/run/x"},
                    {"name": "ws", "mountPath": "/w"},
                ],
            )
        ],
        volumes=[
            {"name": "run", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
            {"name": "ws", "persistentVolumeClaim": {"claimName": "workspace"}},
            {"name": "scratch", "emptyDir": {}},
        ],
        hostname="sandbox",
        hostAliases=[{"ip": "10.1.2.3", "hostnames": ["proxy.test"]}],
        securityContext={"seccompProfile": {"type": "RuntimeDefault"}},
        enableServiceLinks=False,
        labels={"app": "sandbox"},
    )
    api.create_namespaced_pod(namespace, pod)
    unscheduled = wait_for(
        lambda: read_pod(api, namespace, name)["status"].get("conditions") or [],
        lambda conditions: conditions,
    )
    assert (
        unscheduled[-1]["type"] == "PodScheduled" and unscheduled[-1]["reason"] == "Unschedulable"
    )
    api.create_namespaced_persistent_volume_claim(namespace, claim_manifest("workspace"))
    wait_for(lambda: phase_of(api, namespace, name), lambda phase: phase == "Running")
    return namespace, name


def test_a_pod_runs_its_init_container_then_its_containers_in_one_network(
    engine, api, running, configuration
):
    fake, client = engine
    namespace, name = running
    pod = read_pod(api, namespace, name)
    kubernetes_validate.validate(pod, "1.33", strict=True)
    status = pod["status"]
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "PodReadyToStartContainers": "True",
        "Initialized": "True",
        "Ready": "True",
        "ContainersReady": "True",
        "PodScheduled": "True",
    }
    assert state_of(status, "setup")["terminated"]["reason"] == "Completed"
    assert all(s["ready"] and "running" in s["state"] for s in status["containerStatuses"])
    gateway = client.networks.get(fake.docker_network).attrs["IPAM"]["Config"][0]["Gateway"]
    assert status["hostIP"] == gateway and status["podIP"] != gateway

    out, _, _, _ = run_in(
        configuration, namespace, name, ["sh", "-c", "cat /run/x/marker; hostname; cat /etc/hosts"]
    )
    marker, hostname, hosts = out.decode().split("\n", 2)
    assert (marker, hostname) == ("ready", "sandbox")
    assert f"{status['podIP']}\tsandbox" in hosts and "10.1.2.3\tproxy.test" in hosts
    second, _, _, _ = run_in(configuration, namespace, name, ["hostname", "-i"], container="second")
    assert second.decode().split() == [status["podIP"]]
    logs = api.read_namespaced_pod_log(name, namespace, container="setup", tail_lines=1)
    assert logs == "set up\n"


def test_containers_run_with_their_security_context_resources_and_volumes(
    engine, running, configuration
):
    _, client = engine
    namespace, name = running
    script = (
        "id -u; id -g; pwd; echo $GREETING; grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status;"
        " stat -c '%a %U' /run/x /w /t; touch /not-here 2>/dev/null || echo read-only;"
        " touch /run/x/no 2>/dev/null || echo run-read-only; touch /w/file /t/file && echo writable"
    )
    out, err, status, _ = run_in(configuration, namespace, name, ["sh", "-c", script])
    assert status == {"metadata": {}, "status": "Success"}, err
    assert out.decode().splitlines() == [
        "1000",
        "1000",
        "/w",
        "hello",
        "CapEff:\t0000000000000000",
        "NoNewPrivs:\t1",
        "Seccomp:\t2",
        "1777 root",  # a tmpfs emptyDir, read-only in this container
        "755 sandbox",  # the claim, chowned by the init container
        "777 root",  # a disk emptyDir
        "read-only",
        "run-read-only",
        "writable",
    ]
    uid = docker_id_of(client, namespace, name, "main")
    limits = client.api.inspect_container(uid)["HostConfig"]
    assert (limits["NanoCpus"], limits["Memory"]) == (500_000_000, 256 * 1024 * 1024)


def docker_id_of(client, namespace, pod, container_name):
    labels = [
        f"{LABEL}.namespace={namespace}",
        f"{LABEL}.pod={pod}",
        f"{LABEL}.container={container_name}",
    ]
    (found,) = client.containers.list(all=True, filters={"label": labels})
    return found.id


def test_exec_gives_each_stream_and_the_exit_code_in_the_status(running, configuration):
    namespace, name = running
    out, err, status, ws = run_in(
        configuration, namespace, name, ["sh", "-c", "echo out; echo err >&2; exit 3"]
    )
    assert (out, err) == (b"out\n", b"err\n")
    assert ws.subprotocol == "v5.channel.k8s.io"
    assert ws.returncode == 3
    assert status["reason"] == "NonZeroExitCode"
    assert status["details"] == {"causes": [{"reason": "ExitCode", "message": "3"}]}
    _, _, status, ws = run_in(configuration, namespace, name, ["true"])
    assert status == {"metadata": {}, "status": "Success"} and ws.returncode == 0


def test_exec_stdin_ends_when_the_client_closes_it(running, configuration):
    namespace, name = running
    data = os.urandom(1_000_000)
    out, _, _, ws = run_in(configuration, namespace, name, ["sha256sum"], stdin=data)
    assert out.split()[0].decode() == hashlib.sha256(data).hexdigest()
    assert ws.returncode == 0


def test_exec_carries_megabytes_of_binary_output_exactly(running, configuration):
    namespace, name = running
    script = "head -c 6000000 /dev/urandom > /t/blob && cat /t/blob && sha256sum /t/blob >&2"
    out, err, _, ws = run_in(configuration, namespace, name, ["sh", "-c", script])
    assert len(out) == 6_000_000
    assert err.split()[0].decode() == hashlib.sha256(out).hexdigest()
    assert ws.returncode == 0


def test_exec_output_arrives_while_the_command_still_runs(running, configuration):
    namespace, name = running
    ws = stream(
        k8s.CoreV1Api(k8s.ApiClient(configuration)).connect_get_namespaced_pod_exec,
        name,
        namespace,
        command=["sh", "-c", "echo first; sleep 3; echo second"],
        container="main",
        stdin=False,
        stdout=True,
        stderr=True,
        tty=False,
        binary=True,
        _preload_content=False,
    )
    first = wait_for(lambda: ws.read_stdout(timeout=0.2), lambda out: out, timeout=2.5)
    assert first == b"first\n" and ws.is_open()
    ws.close()


def test_exec_speaks_v4_to_a_client_that_offers_only_v4(running, configuration):
    namespace, name = running
    headers = {"sec-websocket-protocol": "v4.channel.k8s.io"}
    out, _, _, ws = run_in(
        configuration, namespace, name, ["sh", "-c", "echo v4; exit 2"], headers=headers
    )
    assert ws.subprotocol == "v4.channel.k8s.io"
    assert (out, ws.returncode) == (b"v4\n", 2)


def test_a_command_that_cannot_start_is_an_internal_error(running, configuration):
    namespace, name = running
    out, _, status, _ = run_in(configuration, namespace, name, ["no-such-command"])
    assert out == b""
    assert (status["reason"], status["code"]) == ("InternalError", 500)
    assert 'exec: "no-such-command": executable file not found' in status["message"]


def test_exec_in_a_missing_pod_or_without_a_container_name_is_refused_before_the_upgrade(
    running, configuration
):
    namespace, name = running
    with pytest.raises(ApiException) as raised:
        run_in(configuration, namespace, "absent", ["true"])
    assert " 404 " in raised.value.reason
    with pytest.raises(ApiException) as raised:
        run_in(configuration, namespace, name, ["true"], container=None)
    assert " 400 " in raised.value.reason
    assert "a container name must be specified for pod sandbox-pod" in raised.value.reason


def test_a_container_takes_a_key_of_a_secret_and_a_missing_secret_is_a_config_error(
    api, configuration, namespace
):
    secret = {"metadata": {"name": "token"}, "stringData": {"value": "s3cret"}}
    api.create_namespaced_secret(namespace, secret)
    assert api.read_namespaced_secret("token", namespace).data == {"value": "czNjcmV0"}

    def env_from(secret_name):
        reference = {"secretKeyRef": {"name": secret_name, "key": "value"}}
        return [
            container(
                "main", ["sleep", "infinity"], env=[{"name": "TOKEN", "valueFrom": reference}]
            )
        ]

    api.create_namespaced_pod(namespace, pod_manifest("with-secret", env_from("token")))
    wait_for(lambda: phase_of(api, namespace, "with-secret"), lambda phase: phase == "Running")
    out, _, _, _ = run_in(configuration, namespace, "with-secret", ["sh", "-c", "echo $TOKEN"])
    assert out == b"s3cret\n"
    api.create_namespaced_pod(namespace, pod_manifest("without-secret", env_from("absent")))
    waiting = wait_for(
        lambda: state_of(read_pod(api, namespace, "without-secret")["status"], "main"),
        lambda state: "waiting" in state and state["waiting"]["reason"] != "ContainerCreating",
    )
    assert waiting["waiting"] == {
        "reason": "CreateContainerConfigError",
        "message": 'secret "absent" not found',
    }
    api.delete_namespaced_secret("token", namespace)
    with pytest.raises(ApiException) as gone:
        api.read_namespaced_secret("token", namespace)
    assert gone.value.status == 404


def test_a_failing_init_container_fails_the_pod(api, configuration, namespace):
    pod = pod_manifest(
        "init-fails",
        [container("main", ["sleep", "infinity"])],
        initContainers=[container("check", ["sh", "-c", "echo refused >&2; exit 7"])],
    )
    api.create_namespaced_pod(namespace, pod)
    wait_for(lambda: phase_of(api, namespace, "init-fails"), lambda phase: phase == "Failed")
    status = read_pod(api, namespace, "init-fails")["status"]
    terminated = state_of(status, "check")["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (7, "Error")
    assert state_of(status, "main") == {"waiting": {"reason": "PodInitializing"}}
    initialized = next(c for c in status["conditions"] if c["type"] == "Initialized")
    assert initialized["status"] == "False" and initialized["reason"] == "ContainersNotInitialized"
    assert api.read_namespaced_pod_log("init-fails", namespace, container="check") == "refused\n"
    with pytest.raises(ApiException) as raised:
        run_in(configuration, namespace, "init-fails", ["true"])
    assert "cannot exec into a container in a completed pod" in raised.value.reason


def test_a_container_killed_behind_the_fakes_back_is_seen_in_a_watch(engine, api, namespace):
    _, client = engine
    api.create_namespaced_pod(
        namespace, pod_manifest("victim", [container("main", ["sleep", "infinity"])])
    )
    pod = wait_for(
        lambda: api.read_namespaced_pod("victim", namespace), lambda p: p.status.phase == "Running"
    )
    events = []
    watch = kubernetes.watch.Watch()

    def follow():
        for event in watch.stream(
            api.list_namespaced_pod,
            namespace,
            field_selector="metadata.name=victim",
            resource_version=pod.metadata.resource_version,
            timeout_seconds=20,
            deserialize=False,
        ):
            events.append(event)
            if event["object"]["status"]["phase"] == "Failed":
                watch.stop()

    follower = threading.Thread(target=follow)
    follower.start()
    client.containers.get(docker_id_of(client, namespace, "victim", "main")).kill()
    follower.join(20)
    assert events and events[-1]["type"] == "MODIFIED"
    terminated = state_of(events[-1]["object"]["status"], "main")["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (137, "Error")


def test_an_evicted_pod_is_failed_with_reason_evicted_and_its_containers_stopped(
    engine, api, namespace
):
    fake, client = engine
    api.create_namespaced_pod(
        namespace, pod_manifest("evicted", [container("main", ["sleep", "infinity"])])
    )
    wait_for(lambda: phase_of(api, namespace, "evicted"), lambda phase: phase == "Running")
    fake.evict(namespace, "evicted")
    status = api.read_namespaced_pod("evicted", namespace).status
    assert (status.phase, status.reason) == ("Failed", "Evicted")
    assert any(c.type == "DisruptionTarget" and c.status == "True" for c in status.conditions)
    main = client.containers.get(docker_id_of(client, namespace, "evicted", "main"))
    assert main.status == "exited"


def test_a_deleted_pod_terminates_then_goes_with_its_emptydirs_and_leaves_its_claim(
    engine, api, namespace
):
    fake, client = engine
    api.create_namespaced_persistent_volume_claim(namespace, claim_manifest("keep"))
    pod = pod_manifest(
        "doomed",
        [
            container(
                "main",
                # Takes a second to end after SIGTERM: the pod is terminating meanwhile.
                [
                    "sh",
                    "-c",
                    "trap 'sleep 1; exit 3' TERM; touch /t/trapped; sleep infinity & wait",
                ],
                volumeMounts=[
                    {"name": "ws", "mountPath": "/w"},
                    {"name": "scratch", "mountPath": "/t"},
                ],
            )
        ],
        volumes=[
            {"name": "ws", "persistentVolumeClaim": {"claimName": "keep"}},
            {"name": "scratch", "emptyDir": {}},
        ],
    )
    api.create_namespaced_pod(namespace, pod)
    running = wait_for(
        lambda: api.read_namespaced_pod("doomed", namespace), lambda p: p.status.phase == "Running"
    )
    own = {"label": [f"{LABEL}={fake.instance}", f"{LABEL}.pod-uid={running.metadata.uid}"]}
    containers = client.containers.list(filters=own)
    assert containers and client.volumes.list(filters=own)
    # Running says the shell started, not that it has set its trap: a TERM before that is
    # ignored (a PID 1 without a handler) and the container killed when the grace ends.
    wait_for(
        lambda: [c.exec_run(["test", "-e", "/t/trapped"]).exit_code for c in containers],
        lambda codes: 0 in codes,
    )

    deleting = api.delete_namespaced_pod("doomed", namespace, grace_period_seconds=5)
    assert deleting.metadata.deletion_timestamp
    with pytest.raises(ApiException) as raised:
        api.create_namespaced_pod(namespace, pod)
    assert raised.value.status == 409
    api.delete_namespaced_persistent_volume_claim("keep", namespace)
    terminating = api.read_namespaced_persistent_volume_claim("keep", namespace)
    assert terminating.metadata.deletion_timestamp  # protected while a pod uses it

    events = kubernetes.watch.Watch().stream(
        api.list_namespaced_pod,
        namespace,
        resource_version=deleting.metadata.resource_version,
        timeout_seconds=15,
        deserialize=False,
    )
    last = None
    for event in events:
        last = event
        if event["type"] == "DELETED":
            break
    assert last["type"] == "DELETED"
    assert state_of(last["object"]["status"], "main")["terminated"]["exitCode"] == 3
    assert not client.containers.list(all=True, filters=own)
    assert not client.volumes.list(filters=own)
    wait_for(
        lambda: api.list_namespaced_persistent_volume_claim(namespace).items,
        lambda items: not items,
    )


def test_a_new_fake_removes_what_the_fake_of_a_killed_run_left(engine):
    _, client = engine
    image = settings.QUOR_SANDBOX_IMAGE
    namespace = os.readlink("/proc/self/ns/pid").removeprefix("pid:[").removesuffix("]")
    dead = {LABEL: f"{namespace}-999999999-deadbeef"}
    alive = {LABEL: f"{namespace}-{os.getpid()}-stillhere"}
    made = [client.containers.create(image, labels=labels) for labels in (dead, alive)]
    volumes = [client.volumes.create(labels=labels) for labels in (dead, alive)]
    another = FakeKubernetes(docker_network="none")
    another.start()
    try:
        left = {c.id for c in client.containers.list(all=True, filters={"label": LABEL})}
        left_volumes = {v.name for v in client.volumes.list(filters={"label": LABEL})}
        assert made[0].id not in left and made[1].id in left
        assert volumes[0].name not in left_volumes and volumes[1].name in left_volumes
    finally:
        another.stop()
        made[1].remove(force=True)
        volumes[1].remove(force=True)


def test_the_fakes_kubelets_never_read_the_environment_pytest_changes_under_them(fake, monkeypatch):
    """pytest sets and deletes PYTEST_CURRENT_TEST between a test's phases while the
    kubelet threads run on: a proxy lookup iterating os.environ then raised KeyError."""
    looked_up = []
    monkeypatch.setattr(
        requests.sessions, "get_environ_proxies", lambda *args, **kw: looked_up.append(args)
    )
    fake.docker.containers.list(filters={"label": f"{LABEL}={fake.instance}"})
    assert looked_up == []
