"""The sandbox pod and workspace claim the Kubernetes backend builds, checked without a
cluster: every field that keeps the sandbox contained, and strict validation against the
Kubernetes schemas of the oldest and newest versions Quor supports."""

import base64
import json

import kubernetes_validate
import pytest
from kubernetes.client import V1PersistentVolumeClaim, V1Pod

from sandboxes.backends import channel
from sandboxes.backends.base import UnsafeSandboxSpec
from sandboxes.backends.kubernetes import (
    ARCHIVE_CONTAINER,
    FIREWALL_CONTAINER,
    SANDBOX_CONTAINER,
    PodPlacement,
    build_exec_secret,
    build_sandbox_pod,
    build_workspace_claim,
    check_server_version,
)
from tests.sandboxes.backends.conftest import new_spec

SUPPORTED_VERSIONS = ["1.30", "1.37"]
CA = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----"


def placement(**changes) -> PodPlacement:
    fields = {
        "namespace": "quor-sandboxes",
        "deployment": "prod",
        "proxy_address": "10.96.0.20",
        "proxy_port": 8899,
        "control_plane_cidr": "10.244.0.0/16",
        "ephemeral_storage": "2Gi",
        "node_selector": {},
        "tolerations": [],
        "runtime_class": "",
        "image_pull_policy": "IfNotPresent",
        "user_namespaces": True,
        **changes,
    }
    return PodPlacement(**fields)


@pytest.fixture
def spec():
    return new_spec(environment={"HTTP_PROXY": "http://10.96.0.20:8899", "QUOR_EGRESS_CA_CERT": CA})


@pytest.fixture
def pod(spec):
    return build_sandbox_pod(spec, placement())


def containers(pod) -> dict[str, dict]:
    spec = pod["spec"]
    return {c["name"]: c for c in spec["initContainers"] + spec["containers"]}


def env_of(container) -> dict[str, str]:
    """The variables given by value (the exec token comes from a Secret)."""
    return {item["name"]: item["value"] for item in container["env"] if "value" in item}


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_the_pod_and_the_claim_validate_strictly_against_each_supported_version(spec, version):
    full = placement(
        node_selector={"quor.example/pool": "sandboxes"},
        tolerations=[{"key": "sandbox", "operator": "Exists", "effect": "NoSchedule"}],
        runtime_class="kata",
    )
    claim = build_workspace_claim(
        spec.sandbox_id, namespace="ns", deployment="prod", size="10Gi", storage_class="fast"
    )
    secret = build_exec_secret(spec.sandbox_id, namespace="ns", deployment="prod")
    pods = (build_sandbox_pod(spec, placement()), build_sandbox_pod(spec, full))
    for manifest in (*pods, claim, secret):
        kubernetes_validate.validate(manifest, version, strict=True)
    V1Pod.model_validate(build_sandbox_pod(spec, full))  # the client's own models agree
    V1PersistentVolumeClaim.model_validate(claim)


def test_the_pod_gets_no_service_account_token_service_links_or_host_namespaces(pod):
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    assert spec["hostNetwork"] is spec["hostPID"] is spec["hostIPC"] is False
    assert spec["shareProcessNamespace"] is False
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["restartPolicy"] == "Never"
    assert spec["hostUsers"] is False
    assert not any("hostPath" in volume for volume in spec["volumes"])


def test_the_sandbox_container_is_the_sandbox_user_with_no_capability_at_all(pod):
    sandbox = containers(pod)[SANDBOX_CONTAINER]
    context = sandbox["securityContext"]
    assert context["runAsUser"] == context["runAsGroup"] == 1000
    assert context["runAsNonRoot"] is True
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["allowPrivilegeEscalation"] is False
    assert context["privileged"] is False
    assert context["readOnlyRootFilesystem"] is True
    run_mount = next(m for m in sandbox["volumeMounts"] if m["mountPath"] == "/run/quor")
    assert run_mount["readOnly"] is True


def test_only_the_firewall_init_container_gets_net_admin_and_only_the_archive_reads_all(pod):
    added = {
        name: container["securityContext"]["capabilities"].get("add", [])
        for name, container in containers(pod).items()
    }
    assert added == {
        FIREWALL_CONTAINER: ["NET_ADMIN", "CHOWN"],
        SANDBOX_CONTAINER: [],
        ARCHIVE_CONTAINER: ["DAC_READ_SEARCH"],
    }
    assert [c["name"] for c in pod["spec"]["initContainers"]] == [FIREWALL_CONTAINER]
    firewall = containers(pod)[FIREWALL_CONTAINER]
    assert firewall["command"][-1] == "--firewall-only"
    archive = containers(pod)[ARCHIVE_CONTAINER]
    assert archive["volumeMounts"] == [
        {"name": "workspace", "mountPath": "/workspace", "readOnly": True}
    ]
    for container in containers(pod).values():
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
        assert container["image"] == pod["spec"]["containers"][0]["image"]


def test_the_proxy_address_is_pinned_in_the_pod_and_its_firewall(pod):
    assert pod["spec"]["hostAliases"] == [{"ip": "10.96.0.20", "hostnames": ["quor-egress-proxy"]}]
    firewall = env_of(containers(pod)[FIREWALL_CONTAINER])
    assert firewall["QUOR_PROXY_HOST"] == "10.96.0.20"
    assert firewall["QUOR_PROXY_PORT"] == "8899"
    assert firewall["QUOR_CONTROL_PLANE_ADDR"] == "10.244.0.0/16"
    assert firewall["QUOR_EGRESS_CA_CERT"] == CA


def test_the_sandbox_container_gets_the_specs_environment_but_not_the_ca_certificate(pod):
    environment = env_of(containers(pod)[SANDBOX_CONTAINER])
    assert environment["HTTP_PROXY"] == "http://10.96.0.20:8899"
    assert "QUOR_EGRESS_CA_CERT" not in environment


def test_the_exec_token_comes_from_the_pods_own_secret_and_is_written_nowhere_in_the_pod(spec, pod):
    token = channel.channel_token(pod["metadata"]["name"])
    assert token not in json.dumps(pod)
    sandbox_env = containers(pod)[SANDBOX_CONTAINER]["env"]
    [entry] = [e for e in sandbox_env if e["name"] == "QUOR_EXEC_TOKEN"]
    secret = build_exec_secret(spec.sandbox_id, namespace="ns", deployment="prod")
    assert entry == {
        "name": "QUOR_EXEC_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": secret["metadata"]["name"], "key": "token"}},
    }
    assert base64.b64decode(secret["data"]["token"]).decode() == token
    assert secret["metadata"]["labels"].items() <= pod["metadata"]["labels"].items()
    for name, container in containers(pod).items():
        if name != SANDBOX_CONTAINER:
            assert "QUOR_EXEC_TOKEN" not in json.dumps(container)


def test_cpu_memory_and_disk_are_requested_and_limited_and_the_workspace_is_sized(spec, pod):
    resources = containers(pod)[SANDBOX_CONTAINER]["resources"]
    expected = {"cpu": "1000m", "memory": str(512 * 1024 * 1024), "ephemeral-storage": "2Gi"}
    assert resources == {"requests": expected, "limits": expected}
    for container in containers(pod).values():
        assert set(container["resources"]["limits"]) == {"cpu", "memory", "ephemeral-storage"}
    claim = build_workspace_claim(
        spec.sandbox_id, namespace="ns", deployment="prod", size="10Gi", storage_class=""
    )
    assert claim["spec"]["resources"] == {"requests": {"storage": "10Gi"}}
    assert "storageClassName" not in claim["spec"]
    volumes = {volume["name"]: volume for volume in pod["spec"]["volumes"]}
    assert volumes["workspace"]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert all(v["emptyDir"]["sizeLimit"] for v in volumes.values() if "emptyDir" in v)


def test_pod_and_claim_carry_the_identity_labels_the_proxy_and_reconciliation_trust(spec, pod):
    labels = {
        "app.kubernetes.io/managed-by": "quor",
        "app.kubernetes.io/component": "sandbox",
        "org.quor.deployment": "prod",
        "org.quor.sandbox-id": spec.sandbox_id,
    }
    claim = build_workspace_claim(
        spec.sandbox_id, namespace="ns", deployment="prod", size="1Gi", storage_class=""
    )
    assert pod["metadata"]["labels"] == claim["metadata"]["labels"] == labels
    assert pod["metadata"]["name"] == f"quor-prod-sandbox-{spec.sandbox_id}"


def test_placement_options_appear_only_when_set(spec, pod):
    assert not {"nodeSelector", "tolerations", "runtimeClassName"} & set(pod["spec"])
    toleration = {"key": "sandbox", "operator": "Exists", "effect": "NoSchedule"}
    placed = build_sandbox_pod(
        spec,
        placement(
            node_selector={"pool": "sandboxes"},
            tolerations=[toleration],
            runtime_class="kata",
            user_namespaces=False,
        ),
    )
    assert placed["spec"]["nodeSelector"] == {"pool": "sandboxes"}
    assert placed["spec"]["tolerations"] == [toleration]
    assert placed["spec"]["runtimeClassName"] == "kata"
    assert placed["spec"]["hostUsers"] is True


def test_the_same_spec_and_placement_give_the_same_pod(spec):
    assert build_sandbox_pod(spec, placement()) == build_sandbox_pod(spec, placement())


def test_an_unsafe_spec_builds_no_pod():
    with pytest.raises(UnsafeSandboxSpec):
        build_sandbox_pod(new_spec(privileged=True), placement())


@pytest.mark.parametrize(
    ("git_version", "major", "minor", "refused"),
    [
        ("v1.29.4", "1", "29", True),
        ("v1.30.0", "1", "30", False),
        ("v1.37.1-gke.100", "1", "37+", False),
        ("v2.0.0", "2", "0", False),
    ],
)
def test_a_server_older_than_the_minimum_is_refused_saying_why(git_version, major, minor, refused):
    if refused:
        with pytest.raises(Exception, match=r"older than 1\.30.*v5\.channel\.k8s\.io"):
            check_server_version(git_version, major, minor)
    else:
        check_server_version(git_version, major, minor)


def test_names_and_labels_fit_kubernetes_limits():
    pod = build_sandbox_pod(new_spec(), placement(deployment="a-long-deployment-name"))
    assert len(pod["metadata"]["name"]) <= 253
    assert all(len(value) <= 63 for value in pod["metadata"]["labels"].values())
