"""The Helm chart (deploy/helm/quor), linted and rendered by the real helm binary; every
rendered object checked against the Kubernetes schemas of the oldest and newest supported
versions, then the invariants the sandbox's containment rests on."""

import copy
import ipaddress
import json
import uuid

import celpy
import kubernetes_validate
import pytest
from celpy import celtypes

from sandboxes.backends.base import SandboxSpec
from sandboxes.backends.kubernetes import SERVICE_ACCOUNT, PodPlacement, build_sandbox_pod
from sandboxes.image import EXEC_CHANNEL_PORT
from tests.deploy.conftest import CHART, NAMESPACE, RELEASE

OLDEST, NEWEST = "1.30.0", "1.37.0"
SANDBOX_NAMESPACE = "quor-sandboxes"

# The one value the chart cannot default: every value set and template call has it.
REQUIRED = {"sandboxes": {"controlPlaneCIDR": "10.244.0.0/16"}}


def merged(base: dict, values: dict | None) -> dict:
    """`values` over `base`, key by key at every depth."""
    result = copy.deepcopy(base)
    for key, value in (values or {}).items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merged(result[key], value)
        else:
            result[key] = value
    return result


def with_required(values: dict | None) -> dict:
    return merged(REQUIRED, values)


VALUE_SETS = {
    "defaults": None,
    "external secrets": {
        "secrets": {
            "name": "ignored-when-each-names-its-own",
            "secretKey": {"secretName": "django", "key": "signing-key"},
            "encryptionKey": {"secretName": "vault-encryption", "key": "key"},
            "databaseUrl": {"secretName": "postgres-app", "key": "uri"},
            "redisUrl": {"secretName": "redis-app", "key": "url"},
            "egressCA": {
                "secretName": "proxy-ca",
                "certKey": "ca.crt",
                "keyKey": "ca.key",
                "signingKeyKey": "signing.key",
            },
        },
        "fileStore": {
            "s3": {
                "bucket": "quor-files",
                "endpointUrl": "https://s3.internal.example",
                "region": "eu-west-1",
                "credentialsSecret": {
                    "name": "s3-credentials",
                    "accessKeyIdKey": "id",
                    "secretAccessKeyKey": "secret",
                },
            }
        },
    },
    "web apps off": {"webApps": {"enabled": False}},
    "every option": {
        "secrets": {
            "create": True,
            "values": {
                "secretKey": "k" * 50,
                "encryptionKey": "e" * 32,
                "databaseUrl": "postgresql://quor:pw@db.internal/quor",
                "redisUrl": "redis://redis.internal:6379/0",
            },
        },
        "ingress": {"className": "nginx", "tlsSecretName": "quor-tls"},
        "webApps": {"tlsSecretName": "apps-wildcard-tls"},
        "controlPlane": {
            "nodeSelector": {"pool": "control"},
            "tolerations": [{"key": "pool", "operator": "Equal", "value": "control"}],
        },
        "sandboxes": {
            "prepull": {"enabled": True},
            "nodeSelector": {"pool": "sandboxes"},
            "tolerations": [{"key": "sandbox", "operator": "Exists", "effect": "NoSchedule"}],
            "runtimeClassName": "kata",
        },
        "dns": {"extraCIDRs": ["169.254.20.10/32"]},
        "egressProxy": {"extraEgressExcept": ["10.96.0.1/32"]},
        "metrics": {
            "scrapeNamespaceLabels": {"kubernetes.io/metadata.name": "monitoring"},
            "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
        },
        "config": {"QUOR_LOG_LEVEL": "DEBUG", "QUOR_SANDBOX_MEMORY_MB": 4096},
    },
}
VALUE_SETS = {name: with_required(values) for name, values in VALUE_SETS.items()}
# Kinds kubernetes_validate has no schema for (custom resources): checked by the
# invariants below, not by a schema.
CUSTOM_RESOURCES = {("monitoring.coreos.com/v1", "ServiceMonitor")}
CONTROL_PLANE = [
    "web",
    "worker-default",
    "worker-sandboxes",
    "worker-agents",
    "worker-knowledge",
    "beat",
    "egress-proxy",
    "webapp-proxy",
]
WORKERS = ["worker-default", "worker-sandboxes", "worker-agents", "worker-knowledge"]
# The workers that share the `worker` account (a Kubernetes token) and may connect into
# sandboxes; the knowledge worker needs neither.
SANDBOX_WORKERS = [w for w in WORKERS if w != "worker-knowledge"]


@pytest.fixture(params=list(VALUE_SETS))
def value_set(request):
    return request.param


@pytest.fixture
def render(helm):
    """render(value set name, kube version=NEWEST) -> the chart's objects."""

    def rendered(name: str, kube_version: str = NEWEST) -> list[dict]:
        return helm.render(name, VALUE_SETS[name], kube_version)

    return rendered


@pytest.fixture
def defaults(render):
    return render("defaults")


def find(objects, kind, name=None, namespace=None):
    found = [
        o
        for o in objects
        if o["kind"] == kind
        and (name is None or o["metadata"]["name"] == name)
        and (namespace is None or o["metadata"].get("namespace") == namespace)
    ]
    assert found, f"no {kind} {name or ''} rendered"
    return found


def one(objects, kind, name, namespace=None):
    (found,) = find(objects, kind, name, namespace)
    return found


def component(objects, name):
    """The pod spec of a control-plane Deployment."""
    return one(objects, "Deployment", f"{RELEASE}-{name}")["spec"]["template"]["spec"]


def selects(peer, namespace, component_name):
    return peer == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        "podSelector": {
            "matchLabels": {
                "app.kubernetes.io/name": "quor",
                "app.kubernetes.io/instance": RELEASE,
                "app.kubernetes.io/component": component_name,
            }
        },
    }


# --- helm itself ---------------------------------------------------------------------


def test_helm_lint_strict_passes_for_every_value_set(helm, value_set):
    for version in (OLDEST, NEWEST):
        result = helm.run(
            "lint", "--strict", str(CHART), "--namespace", NAMESPACE,
            "--kube-version", version, values=VALUE_SETS[value_set],
        )  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("kube_version", [OLDEST, NEWEST])
def test_every_rendered_object_is_valid_for_the_oldest_and_newest_supported_kubernetes(
    render, value_set, kube_version
):
    objects = render(value_set, kube_version)
    validated = 0
    for obj in objects:
        where = f"{obj['kind']} {obj['metadata']['name']} ({value_set}, {kube_version})"
        try:
            kubernetes_validate.validate(obj, kube_version, strict=True)
            validated += 1
        except kubernetes_validate.SchemaNotFoundError:
            assert (obj["apiVersion"], obj["kind"]) in CUSTOM_RESOURCES, f"no schema for {where}"
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{where}: {error.message} at {list(error.absolute_path)}")
    assert validated >= 25


@pytest.mark.parametrize(
    "values",
    [
        {"replicaCount": 3},
        {"web": {"replicas": 2, "replica": 3}},
        {"sandboxes": {"admissionPolicy": {"enabled": True, "mode": "audit"}}},
        {"secrets": {"databaseUrl": {"secretName": "", "key": "uri", "optional": True}}},
    ],
)
def test_the_schema_refuses_an_unknown_key_at_any_depth(helm, values):
    result = helm.template(with_required(values), NEWEST)
    assert result.returncode != 0
    assert "additional properties" in result.stderr


def test_the_schema_refuses_a_secret_in_the_plain_settings(helm):
    result = helm.template(with_required({"config": {"QUOR_ENCRYPTION_KEY": "oops"}}), NEWEST)
    assert result.returncode != 0
    assert "QUOR_ENCRYPTION_KEY" in result.stderr


def test_a_setting_the_chart_derives_cannot_be_overridden_by_config(helm):
    result = helm.template(with_required({"config": {"QUOR_SANDBOX_BACKEND": "docker"}}), NEWEST)
    assert result.returncode != 0
    assert "config.QUOR_SANDBOX_BACKEND" in result.stderr


def test_a_cluster_older_than_1_30_is_refused_with_the_reason(helm):
    result = helm.template(with_required(None), "1.29.15")
    assert result.returncode != 0
    assert "Quor needs Kubernetes 1.30 or newer" in result.stderr


def test_the_control_plane_cidr_is_required_with_the_reason(helm):
    result = helm.template(None, NEWEST)
    assert result.returncode != 0
    assert "sandboxes.controlPlaneCIDR is required" in result.stderr
    assert "in-pod firewall" in result.stderr


@pytest.mark.parametrize(
    "image",
    [
        "quor-sandbox:latest",
        "registry.example.com/quor-sandbox:latest",
        "quor-sandbox",
        "registry.example.com:5000/quor-sandbox",
    ],
)
def test_the_schema_refuses_a_sandbox_image_tagged_latest_or_with_no_tag(helm, image):
    result = helm.template(with_required({"sandboxes": {"image": image}}), NEWEST)
    assert result.returncode != 0
    assert "/sandboxes/image" in result.stderr


@pytest.mark.parametrize(
    "image",
    [
        "registry.example.com:5000/quor-sandbox:2026.12.01-3",
        "registry.example.com/quor-sandbox@sha256:" + "0f" * 32,
    ],
)
def test_a_sandbox_image_with_a_tag_or_a_digest_is_accepted(helm, image):
    result = helm.template(with_required({"sandboxes": {"image": image}}), NEWEST)
    assert result.returncode == 0, result.stderr


def test_the_sandbox_namespace_cannot_be_the_release_namespace(helm):
    result = helm.template(with_required({"sandboxes": {"namespace": NAMESPACE}}), NEWEST)
    assert result.returncode != 0
    assert "a namespace of its own" in result.stderr


# --- secrets ---------------------------------------------------------------------------


def test_the_default_render_holds_no_secret_value(defaults):
    assert [o for o in defaults if o["kind"] == "Secret"] == []
    env = [e for o in defaults for e in all_env(o)]
    for name in ("QUOR_SECRET_KEY", "QUOR_ENCRYPTION_KEY", "DATABASE_URL", "REDIS_URL"):
        entries = [e for e in env if e["name"] == name]
        assert entries
        assert all("value" not in e and "secretKeyRef" in e["valueFrom"] for e in entries)
    data = one(defaults, "ConfigMap", f"{RELEASE}-config")["data"]
    assert not {"QUOR_SECRET_KEY", "QUOR_ENCRYPTION_KEY", "DATABASE_URL", "REDIS_URL"} & set(data)


def test_external_secrets_are_read_by_their_own_names_and_keys(render):
    objects = render("external secrets")
    refs = {
        e["name"]: e["valueFrom"]["secretKeyRef"]
        for e in all_env(one(objects, "Deployment", f"{RELEASE}-web"))
        if "valueFrom" in e
    }
    assert refs == {
        "QUOR_SECRET_KEY": {"name": "django", "key": "signing-key"},
        "QUOR_ENCRYPTION_KEY": {"name": "vault-encryption", "key": "key"},
        "DATABASE_URL": {"name": "postgres-app", "key": "uri"},
        "REDIS_URL": {"name": "redis-app", "key": "url"},
        "QUOR_FILE_STORE_S3_ACCESS_KEY_ID": {"name": "s3-credentials", "key": "id"},
        "QUOR_FILE_STORE_S3_SECRET_ACCESS_KEY": {"name": "s3-credentials", "key": "secret"},
    }
    ca = next(v for v in component(objects, "egress-proxy")["volumes"] if v["name"] == "egress-ca")
    assert ca["secret"]["secretName"] == "proxy-ca"
    assert ca["secret"]["items"] == [
        {"key": "ca.crt", "path": "ca.crt"},
        {"key": "ca.key", "path": "ca.key"},
        {"key": "signing.key", "path": "signing.key"},
    ]
    assert [o for o in objects if o["kind"] in ("Secret", "PersistentVolumeClaim")] == []


def test_secrets_create_is_refused_without_every_value(helm):
    values = {"secretKey": "k", "encryptionKey": "e", "databaseUrl": "postgresql://x/y"}
    result = helm.template(with_required({"secrets": {"create": True, "values": values}}), NEWEST)
    assert result.returncode != 0
    assert "secrets.create needs secrets.values.redisUrl" in result.stderr


def test_secret_values_without_secrets_create_are_refused(helm):
    result = helm.template(with_required({"secrets": {"values": {"secretKey": "k"}}}), NEWEST)
    assert result.returncode != 0
    assert "secrets.values are used only with secrets.create" in result.stderr


def all_env(obj):
    """The env entries of a workload's containers (none for other kinds)."""
    pod = obj.get("spec", {}).get("template", {}).get("spec", {})
    for container in pod.get("containers", []) + pod.get("initContainers", []):
        yield from container.get("env", [])


# --- the sandbox namespace ---------------------------------------------------------------


def test_the_sandbox_namespace_enforces_privileged_and_warns_and_audits_restricted(defaults):
    namespace = one(defaults, "Namespace", SANDBOX_NAMESPACE)
    labels = namespace["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    assert labels["pod-security.kubernetes.io/warn"] == "restricted"
    assert labels["pod-security.kubernetes.io/audit"] == "restricted"
    assert namespace["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_sandbox_pods_have_a_service_account_with_no_token_and_no_binding(defaults):
    account = one(defaults, "ServiceAccount", "quor-sandbox", SANDBOX_NAMESPACE)
    assert account["automountServiceAccountToken"] is False
    subjects = [s for b in find(defaults, "RoleBinding") for s in b["subjects"]]
    assert "quor-sandbox" not in {s["name"] for s in subjects}


def test_the_backend_gets_exactly_the_verbs_of_the_design_and_nothing_cluster_wide(defaults):
    assert not [o for o in defaults if o["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    roles = {(r["metadata"]["namespace"], r["metadata"]["name"]): r for r in find(defaults, "Role")}
    assert set(roles) == {
        (SANDBOX_NAMESPACE, f"{RELEASE}-sandboxes"),
        (NAMESPACE, f"{RELEASE}-egress-service"),
    }
    granted = {
        (tuple(rule["apiGroups"]), tuple(rule["resources"]), frozenset(rule["verbs"]))
        for rule in roles[(SANDBOX_NAMESPACE, f"{RELEASE}-sandboxes")]["rules"]
    }
    assert granted == {
        (("",), ("pods",), frozenset({"get", "list", "watch", "create", "delete"})),
        (("",), ("pods/exec",), frozenset({"get", "create"})),
        (("",), ("pods/log",), frozenset({"get"})),
        (("",), ("persistentvolumeclaims",), frozenset({"get", "list", "create", "delete"})),
        (("",), ("secrets",), frozenset({"create", "delete"})),
    }
    assert all(
        "resourceNames" not in r
        for r in roles[(SANDBOX_NAMESPACE, f"{RELEASE}-sandboxes")]["rules"]
    )
    assert roles[(NAMESPACE, f"{RELEASE}-egress-service")]["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["services"],
            "resourceNames": [f"{RELEASE}-egress-proxy"],
            "verbs": ["get"],
        }
    ]


def test_only_web_and_workers_are_bound_and_only_they_get_a_token(defaults):
    expected = [
        {"kind": "ServiceAccount", "name": f"{RELEASE}-web", "namespace": NAMESPACE},
        {"kind": "ServiceAccount", "name": f"{RELEASE}-worker", "namespace": NAMESPACE},
    ]
    bindings = find(defaults, "RoleBinding")
    assert len(bindings) == 2
    for binding in bindings:
        assert binding["subjects"] == expected
        assert binding["roleRef"]["kind"] == "Role"
    for name in CONTROL_PLANE:
        pod = component(defaults, name)
        talks_to_api = name == "web" or name in SANDBOX_WORKERS
        assert pod["automountServiceAccountToken"] is talks_to_api, name
        account = "worker" if name in SANDBOX_WORKERS else name
        assert pod["serviceAccountName"] == f"{RELEASE}-{account}"
    job = one(defaults, "Job", f"{RELEASE}-migrate")["spec"]["template"]["spec"]
    assert job["automountServiceAccountToken"] is False


def test_the_knowledge_worker_gets_no_kubernetes_api_no_egress_ca_and_no_way_into_sandboxes(
    render, value_set
):
    """It talks to PostgreSQL, Redis and the file store only, and parses files admins
    upload: nothing of the sandboxes' (unlike worker-default, which shares `worker`)."""
    objects = render(value_set)
    account = one(objects, "ServiceAccount", f"{RELEASE}-worker-knowledge", NAMESPACE)
    assert account["automountServiceAccountToken"] is False
    bound = {s["name"] for b in find(objects, "RoleBinding") for s in b["subjects"]}
    assert f"{RELEASE}-worker-knowledge" not in bound
    pod = component(objects, "worker-knowledge")
    assert pod["serviceAccountName"] == f"{RELEASE}-worker-knowledge"
    assert pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    volumes = {v["name"] for v in pod["volumes"]}
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert not {"egress-ca", "egress-ca-dir"} & volumes
    assert not [m for m in mounts if m.startswith("/var/lib/quor/egress-ca")]
    on_s3 = bool(VALUE_SETS[value_set].get("fileStore", {}).get("s3", {}).get("bucket"))
    assert ("/var/lib/quor/files" in mounts) is not on_s3
    ingress = one(objects, "NetworkPolicy", f"{RELEASE}-sandbox-ingress", SANDBOX_NAMESPACE)
    peers = [
        peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
        for rule in ingress["spec"]["ingress"]
        for peer in rule["from"]
    ]
    assert "worker-knowledge" not in peers
    assert "worker-default" in peers  # the policy is the one the other workers are in


def test_the_knowledge_worker_defaults_to_one_process_with_room_for_the_embedding_model(
    defaults,
):
    deployment = one(defaults, "Deployment", f"{RELEASE}-worker-knowledge")
    assert deployment["spec"]["replicas"] == 1
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[args.index("--concurrency") + 1] == "1"
    assert container["resources"] == {
        "requests": {"cpu": "500m", "memory": "1Gi"},
        "limits": {"cpu": "1", "memory": "2Gi"},
    }


def test_the_admission_policy_pins_the_two_root_exceptions_to_the_sandbox_image(defaults):
    policy = one(defaults, "ValidatingAdmissionPolicy", f"{SANDBOX_NAMESPACE}-sandbox-pods")
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule["operations"] == ["CREATE", "UPDATE"]
    assert set(rule["resources"]) == {"pods", "pods/ephemeralcontainers"}
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    assert variables["sandboxImage"] == "'quor-sandbox:0.1.0'"
    expressions = " ".join(v["expression"] for v in spec["validations"])
    for needed in (
        "object.spec.hostNetwork",
        "object.spec.hostPID",
        "object.spec.hostIPC",
        "has(v.emptyDir) || has(v.persistentVolumeClaim)",
        "!has(p.hostPort) || p.hostPort == 0",
        "seccompProfile.type in ['RuntimeDefault', 'Localhost']",
        "appArmorProfile.type != 'Unconfined'",
        "!has(c.securityContext.seLinuxOptions)",
        "c.securityContext.procMount == 'Default'",
        "size(object.spec.securityContext.sysctls) == 0",
        "!has(c.restartPolicy)",
        "object.spec.automountServiceAccountToken == false",
        "!c.securityContext.privileged",
        "c.securityContext.allowPrivilegeEscalation == false",
        "'ALL' in c.securityContext.capabilities.drop",
        "c.name == 'quor-firewall' && c.image == variables.sandboxImage",
        "add.all(a, a in ['NET_ADMIN', 'CHOWN'])",
        "c.name == 'quor-archive' && c.image == variables.sandboxImage",
        "add.all(a, a in ['DAC_READ_SEARCH'])",
        "object.spec.hostUsers == false",
        "c.securityContext.runAsNonRoot : variables.podRunsAsNonRoot",
        "size(object.spec.ephemeralContainers) == 0",
    ):
        assert needed in expressions, needed
    # The firewall's exception is for init containers only, the archive's for containers.
    firewall = next(v for v in spec["validations"] if "quor-firewall" in v["expression"])
    assert firewall["expression"].startswith("variables.initContainers.all(")
    archive = next(v for v in spec["validations"] if "quor-archive" in v["expression"])
    assert archive["expression"].startswith("object.spec.containers.all(")
    binding = one(defaults, "ValidatingAdmissionPolicyBinding", f"{SANDBOX_NAMESPACE}-sandbox-pods")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert binding["spec"]["matchResources"]["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": SANDBOX_NAMESPACE}
    }


@pytest.fixture
def backend_pod(defaults):
    """The pod the backend builds from the chart's own settings."""
    settings = one(defaults, "ConfigMap", f"{RELEASE}-config")["data"]
    spec = SandboxSpec(
        sandbox_id=str(uuid.uuid4()),
        image=settings["QUOR_SANDBOX_IMAGE"],
        cpus=1.0,
        memory_bytes=1 << 30,
        pids_limit=256,
    )
    place = PodPlacement(
        namespace=settings["QUOR_KUBERNETES_NAMESPACE"],
        deployment=settings["QUOR_DEPLOYMENT"],
        proxy_address="10.96.0.20",
        proxy_port=int(settings["QUOR_EGRESS_PROXY_PORT"]),
        control_plane_cidr=settings["QUOR_KUBERNETES_CONTROL_PLANE_CIDR"],
        ephemeral_storage=settings["QUOR_KUBERNETES_EPHEMERAL_STORAGE"],
        node_selector=json.loads(settings["QUOR_KUBERNETES_NODE_SELECTOR"]),
        tolerations=json.loads(settings["QUOR_KUBERNETES_TOLERATIONS"]),
        runtime_class=settings["QUOR_KUBERNETES_RUNTIME_CLASS"],
        image_pull_policy=settings["QUOR_KUBERNETES_IMAGE_PULL_POLICY"],
        user_namespaces=settings["QUOR_KUBERNETES_USER_NAMESPACES"] == "true",
    )
    return build_sandbox_pod(spec, place)


@pytest.fixture
def admission_policy(defaults):
    return one(defaults, "ValidatingAdmissionPolicy", f"{SANDBOX_NAMESPACE}-sandbox-pods")


def refusals(policy: dict, pod: dict) -> list[str]:
    """The messages of the policy's validations that refuse `pod`: each CEL expression
    evaluated (by cel-python) on the pod as the API server would; an expression that
    errors refuses too (failurePolicy Fail)."""
    environment = celpy.Environment()
    activation = {"object": celpy.json_to_cel(pod), "variables": celtypes.MapType()}

    def evaluate(expression):
        program = environment.program(environment.compile(expression))
        return program.evaluate(activation)

    for variable in policy["spec"]["variables"]:
        value = evaluate(variable["expression"])
        activation["variables"][celtypes.StringType(variable["name"])] = value
    refused = []
    for validation in policy["spec"]["validations"]:
        try:
            result = evaluate(validation["expression"])
        except celpy.CELEvalError:
            result = None
        if not (isinstance(result, celtypes.BoolType) and bool(result)):
            refused.append(validation["message"])
    return refused


def test_the_admission_policy_admits_the_pod_the_backend_builds(backend_pod, admission_policy):
    """A rule the backend's own pod breaks would make every sandbox start fail."""
    assert backend_pod["metadata"]["namespace"] == SANDBOX_NAMESPACE
    assert SERVICE_ACCOUNT == backend_pod["spec"]["serviceAccountName"] == "quor-sandbox"
    assert backend_pod["spec"]["hostUsers"] is False  # the policy requires it by default
    assert len(admission_policy["spec"]["validations"]) >= 20
    assert refusals(admission_policy, backend_pod) == []


def firewall(pod):
    (container,) = pod["spec"]["initContainers"]
    return container


def archive(pod):
    return next(c for c in pod["spec"]["containers"] if c["name"] == "quor-archive")


def sandbox(pod):
    return next(c for c in pod["spec"]["containers"] if c["name"] == "sandbox")


def extra_container(name, image, add):
    return {
        "name": name,
        "image": image,
        "securityContext": {
            "runAsNonRoot": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"], "add": add},
        },
    }


FIREWALL_PINNED = "the init container quor-firewall must be exactly the one Quor builds"
ARCHIVE_PINNED = "the container quor-archive must be exactly the one Quor builds"
# What each mutation of the backend's pod does, and the validation that must refuse it.
MUTATIONS = {
    "the firewall running another command": (
        lambda pod: firewall(pod).update(command=["/bin/sh", "-c", "sleep infinity"]),
        FIREWALL_PINNED,
    ),
    "the firewall given args": (
        lambda pod: firewall(pod).update(args=["--debug"]),
        FIREWALL_PINNED,
    ),
    "the firewall made a native sidecar": (
        lambda pod: firewall(pod).update(restartPolicy="Always"),
        FIREWALL_PINNED,
    ),
    "the firewall mounting the sandbox's home too": (
        lambda pod: firewall(pod)["volumeMounts"].append(
            {"name": "home", "mountPath": "/home/sandbox"}
        ),
        FIREWALL_PINNED,
    ),
    "the firewall with LD_PRELOAD": (
        lambda pod: firewall(pod)["env"].append({"name": "LD_PRELOAD", "value": "/w/x.so"}),
        FIREWALL_PINNED,
    ),
    "the firewall with another image": (
        lambda pod: firewall(pod).update(image="busybox:1"),
        FIREWALL_PINNED,
    ),
    "a second init container named quor-firewall with another image": (
        lambda pod: pod["spec"]["initContainers"].append({**firewall(pod), "image": "evil:1"}),
        FIREWALL_PINNED,
    ),
    "the archive's workspace writable": (
        lambda pod: archive(pod)["volumeMounts"][0].update(readOnly=False),
        ARCHIVE_PINNED,
    ),
    "the archive mounting the run directory": (
        lambda pod: archive(pod)["volumeMounts"].append({"name": "run", "mountPath": "/run/quor"}),
        ARCHIVE_PINNED,
    ),
    "the archive running another command": (
        lambda pod: archive(pod).update(command=["/bin/sh", "-c", "cat /workspace/x"]),
        ARCHIVE_PINNED,
    ),
    "the archive running a postStart hook": (
        lambda pod: archive(pod).update(lifecycle={"postStart": {"exec": {"command": ["id"]}}}),
        ARCHIVE_PINNED,
    ),
    "a hostPath volume": (
        lambda pod: pod["spec"]["volumes"].append({"name": "node", "hostPath": {"path": "/"}}),
        "sandbox pods may have only emptyDir and persistentVolumeClaim volumes",
    ),
    "a projected volume": (
        lambda pod: pod["spec"]["volumes"].append(
            {"name": "token", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}
        ),
        "sandbox pods may have only emptyDir and persistentVolumeClaim volumes",
    ),
    "a container with a host port": (
        lambda pod: sandbox(pod).update(ports=[{"containerPort": 8080, "hostPort": 8080}]),
        "no container of a sandbox pod may use a host port",
    ),
    "the pod's seccomp profile Unconfined": (
        lambda pod: pod["spec"]["securityContext"].update(seccompProfile={"type": "Unconfined"}),
        "must use the seccomp profile RuntimeDefault or Localhost",
    ),
    "a container's seccomp profile Unconfined": (
        lambda pod: sandbox(pod)["securityContext"].update(seccompProfile={"type": "Unconfined"}),
        "must use the seccomp profile RuntimeDefault or Localhost",
    ),
    "a container's AppArmor profile Unconfined": (
        lambda pod: sandbox(pod)["securityContext"].update(appArmorProfile={"type": "Unconfined"}),
        "sandbox pods may not run unconfined by AppArmor",
    ),
    "the AppArmor annotation unconfined": (
        lambda pod: pod["metadata"].update(
            annotations={"container.apparmor.security.beta.kubernetes.io/sandbox": "unconfined"}
        ),
        "sandbox pods may not run unconfined by AppArmor",
    ),
    "seLinuxOptions": (
        lambda pod: pod["spec"]["securityContext"].update(seLinuxOptions={"type": "spc_t"}),
        "sandbox pods may not set seLinuxOptions",
    ),
    "an unmasked /proc": (
        lambda pod: sandbox(pod)["securityContext"].update(procMount="Unmasked"),
        "no container of a sandbox pod may use a procMount other than Default",
    ),
    "a sysctl": (
        lambda pod: pod["spec"]["securityContext"].update(
            sysctls=[{"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}]
        ),
        "sandbox pods may not set sysctls",
    ),
    "a third container adding a capability": (
        lambda pod: pod["spec"]["containers"].append(
            extra_container("helper", archive(pod)["image"], ["NET_RAW"])
        ),
        "only the container quor-archive with the sandbox image may add a capability",
    ),
    "a container named quor-firewall adding NET_ADMIN": (
        lambda pod: pod["spec"]["containers"].append(
            extra_container("quor-firewall", archive(pod)["image"], ["NET_ADMIN"])
        ),
        "only the container quor-archive with the sandbox image may add a capability",
    ),
    "the node's user namespace": (
        lambda pod: pod["spec"].update(hostUsers=True),
        "sandbox pods must run in a user namespace of their own",
    ),
}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_the_admission_policy_refuses_each_change_to_the_backends_pod(
    backend_pod, admission_policy, mutation
):
    mutate, expected = MUTATIONS[mutation]
    pod = copy.deepcopy(backend_pod)
    mutate(pod)
    refused = refusals(admission_policy, pod)
    assert any(expected in message for message in refused), refused


# --- NetworkPolicies ------------------------------------------------------------------------


def test_sandboxes_may_reach_only_the_egress_proxy_and_dns(render):
    objects = render("every option")
    policy = one(objects, "NetworkPolicy", f"{RELEASE}-sandbox-egress", SANDBOX_NAMESPACE)
    spec = policy["spec"]
    assert spec["podSelector"] == {}  # every pod in the namespace
    assert spec["policyTypes"] == ["Egress"]
    to_proxy, to_dns = spec["egress"]
    (proxy,) = to_proxy["to"]
    assert selects(proxy, NAMESPACE, "egress-proxy")
    assert to_proxy["ports"] == [{"protocol": "TCP", "port": 8899}]
    assert to_dns["to"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
        },
        {"ipBlock": {"cidr": "169.254.20.10/32"}},
    ]
    assert sorted(p["protocol"] for p in to_dns["ports"]) == ["TCP", "UDP"]
    assert {p["port"] for p in to_dns["ports"]} == {53}


def test_only_the_web_app_proxy_web_and_workers_may_connect_into_sandboxes(defaults):
    policy = one(defaults, "NetworkPolicy", f"{RELEASE}-sandbox-ingress", SANDBOX_NAMESPACE)
    spec = policy["spec"]
    assert spec["podSelector"] == {}
    assert spec["policyTypes"] == ["Ingress"]
    from_webapp_proxy, from_transfers = spec["ingress"]
    (peer,) = from_webapp_proxy["from"]
    assert selects(peer, NAMESPACE, "webapp-proxy")
    # webapps/services.py: a web app listens on a port from 1024 to 65535, not on the
    # exec channel's.
    assert from_webapp_proxy["ports"] == [
        {"protocol": "TCP", "port": 1024, "endPort": EXEC_CHANNEL_PORT - 1},
        {"protocol": "TCP", "port": EXEC_CHANNEL_PORT + 1, "endPort": 65535},
    ]
    for peer, name in zip(from_transfers["from"], ["web", *SANDBOX_WORKERS], strict=True):
        assert selects(peer, NAMESPACE, name)
    # A transfer's port is chosen by the sandbox: every TCP port.
    assert from_transfers["ports"] == [{"protocol": "TCP"}]


def test_with_web_apps_off_nothing_serves_or_reaches_web_apps(render):
    objects = render("web apps off")
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    for kind in ("Deployment", "Service", "ServiceAccount"):
        assert (kind, f"{RELEASE}-webapp-proxy") not in names
    assert [i["metadata"]["name"] for i in find(objects, "Ingress")] == [RELEASE]
    ingress = one(objects, "NetworkPolicy", f"{RELEASE}-sandbox-ingress")["spec"]["ingress"]
    assert len(ingress) == 1
    assert [
        p["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for p in ingress[0]["from"]
    ] == [
        "web",
        *SANDBOX_WORKERS,
    ]
    data = one(objects, "ConfigMap", f"{RELEASE}-config")["data"]
    assert "QUOR_WEBAPP_BASE_URL" not in data


def test_the_egress_proxy_takes_only_sandboxes_and_scrapes_and_never_reaches_link_local(render):
    objects = render("every option")
    spec = one(objects, "NetworkPolicy", f"{RELEASE}-egress-proxy", NAMESPACE)["spec"]
    assert spec["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "egress-proxy"
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    from_sandboxes, from_scrapers = spec["ingress"]
    assert from_sandboxes == {
        "from": [
            {
                "namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": SANDBOX_NAMESPACE}
                }
            }
        ],
        "ports": [{"protocol": "TCP", "port": 8899}],
    }
    assert from_scrapers == {
        "from": [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
        ],
        "ports": [{"protocol": "TCP", "port": 9100}],
    }
    blocks = [
        peer["ipBlock"] for rule in spec["egress"] for peer in rule["to"] if "ipBlock" in peer
    ]
    internet = [b for b in blocks if b["cidr"] == "0.0.0.0/0"]
    assert internet == [{"cidr": "0.0.0.0/0", "except": ["169.254.0.0/16", "10.96.0.1/32"]}]
    # Any other address block is DNS only (NodeLocal DNSCache on link-local), port 53.
    for rule in spec["egress"]:
        for peer in rule["to"]:
            cidr = peer.get("ipBlock", {}).get("cidr")
            if cidr and cidr != "0.0.0.0/0":
                assert ipaddress.ip_network(cidr).subnet_of(ipaddress.ip_network("169.254.0.0/16"))
                assert {p["port"] for p in rule["ports"]} == {53}


def test_the_image_prepull_daemonset_pulls_like_the_backend_and_is_cut_off(render):
    objects = render("every option")
    daemonset = one(objects, "DaemonSet", f"{RELEASE}-sandbox-image-prepull")
    pod = daemonset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "quor-sandbox:0.1.0"
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert "priorityClassName" not in pod
    assert pod["automountServiceAccountToken"] is False
    assert pod["nodeSelector"] == {"pool": "sandboxes"}
    assert pod["tolerations"] == [{"key": "sandbox", "operator": "Exists", "effect": "NoSchedule"}]
    assert_locked_down(container, pod)
    deny = one(objects, "NetworkPolicy", f"{RELEASE}-sandbox-image-prepull")["spec"]
    assert deny["policyTypes"] == ["Ingress", "Egress"]
    assert "ingress" not in deny and "egress" not in deny
    labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert deny["podSelector"]["matchLabels"].items() <= labels.items()


# --- control-plane pods ------------------------------------------------------------------------


def assert_locked_down(container, pod):
    context = container["securityContext"]
    assert context["runAsNonRoot"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context.get("privileged", False) is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not any(pod.get(key) for key in ("hostNetwork", "hostPID", "hostIPC"))
    assert not any("hostPath" in volume for volume in pod.get("volumes", []))
    resources = container["resources"]
    assert {"cpu", "memory"} <= resources["requests"].keys()
    assert {"cpu", "memory"} <= resources["limits"].keys()


def test_every_control_plane_container_is_locked_down(render, value_set):
    objects = render(value_set)
    pods = [
        o["spec"]["template"]["spec"]
        for o in objects
        if o["kind"] in ("Deployment", "Job") and o["metadata"]["namespace"] == NAMESPACE
    ]
    assert len(pods) == (7 if value_set == "web apps off" else 8) + 1  # and the migration Job
    for pod in pods:
        assert pod["enableServiceLinks"] is False  # a Service's *_PORT would shadow QUOR_* settings
        for container in pod["containers"] + pod.get("initContainers", []):
            assert_locked_down(container, pod)
            assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_each_process_runs_by_its_command_and_serves_metrics(defaults):
    # args: the image's entrypoint (tini) runs each command as its child.
    commands = {name: component(defaults, name)["containers"][0]["args"] for name in CONTROL_PLANE}
    web = ["python", "manage.py", "serve_web", "--bind", "0.0.0.0", "--port", "8000"]  # noqa: S104
    assert commands["web"] == [*web, "--processes", "2"]
    for worker in WORKERS:  # one per Celery queue
        queue = worker.removeprefix("worker-")
        assert commands[worker][:8] == [
            "celery", "-A", "quor", "worker", "-Q", queue, "-n", f"{queue}@%h",
        ]  # fmt: skip
    assert [w.removeprefix("worker-") for w in WORKERS] == [
        "default", "sandboxes", "agents", "knowledge",
    ]  # fmt: skip
    assert commands["beat"][:4] == ["celery", "-A", "quor", "beat"]
    assert commands["egress-proxy"][:3] == ["python", "manage.py", "run_egress_proxy"]
    assert commands["webapp-proxy"] == ["python", "manage.py", "run_webapp_proxy"]
    for name in CONTROL_PLANE:
        deployment = one(defaults, "Deployment", f"{RELEASE}-{name}")
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert container["image"] == "quor:0.1.0"
        assert "command" not in container
        assert {"name": "metrics", "containerPort": 9100, "protocol": "TCP"} in container["ports"]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert labels["app.kubernetes.io/component"] == name
        assert labels["org.quor.metrics"] == "true"


def test_beat_is_a_single_replica_that_is_recreated_not_rolled(defaults):
    beat = one(defaults, "Deployment", f"{RELEASE}-beat")
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"] == {"type": "Recreate"}


def test_migrations_run_as_a_pre_install_and_pre_upgrade_hook_with_the_same_settings(defaults):
    job = one(defaults, "Job", f"{RELEASE}-migrate")
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "pre-install,pre-upgrade"
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    (container,) = pod["containers"]
    assert container["args"] == ["python", "manage.py", "migrate", "--noinput"]
    inline = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    settings = one(defaults, "ConfigMap", f"{RELEASE}-config")["data"]
    assert {k: v for k, v in inline.items() if k != "HOME"} == settings


def test_settings_point_the_backend_at_the_sandbox_namespace_and_the_egress_service(defaults):
    data = one(defaults, "ConfigMap", f"{RELEASE}-config")["data"]
    assert data["QUOR_SANDBOX_BACKEND"] == "kubernetes"
    assert data["QUOR_KUBERNETES_NAMESPACE"] == SANDBOX_NAMESPACE
    assert data["QUOR_KUBERNETES_EGRESS_SERVICE"] == f"{NAMESPACE}/{RELEASE}-egress-proxy"
    assert data["QUOR_KUBERNETES_KUBECONFIG"] == ""  # in-cluster service account
    assert data["QUOR_EGRESS_PROXY_PORT"] == "8899"
    assert (
        data["QUOR_SANDBOX_API_URL"] == f"http://{RELEASE}-web.{NAMESPACE}.svc.cluster.local:8000"
    )
    assert data["QUOR_WEBAPP_PROXY_BIND"] == "0.0.0.0:8001"
    assert data["QUOR_KUBERNETES_NODE_SELECTOR"] == "{}"
    assert data["QUOR_KUBERNETES_TOLERATIONS"] == "[]"
    assert all(isinstance(value, str) for value in data.values())
    service = one(defaults, "Service", f"{RELEASE}-egress-proxy")
    assert service["spec"]["ports"] == [
        {"name": "proxy", "port": 8899, "targetPort": "proxy", "protocol": "TCP"}
    ]


def test_quor_and_the_wildcard_web_app_host_each_have_an_ingress(render):
    ingresses = {i["metadata"]["name"]: i["spec"] for i in find(render("every option"), "Ingress")}
    assert ingresses[RELEASE]["rules"][0]["host"] == "quor.example.com"
    assert ingresses[RELEASE]["tls"] == [{"hosts": ["quor.example.com"], "secretName": "quor-tls"}]
    webapps = ingresses[f"{RELEASE}-webapps"]
    assert webapps["rules"][0]["host"] == "*.apps.example.com"
    backend = webapps["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": f"{RELEASE}-webapp-proxy", "port": {"name": "http"}}


def test_the_service_monitor_scrapes_every_process_through_the_metrics_service(render):
    objects = render("every option")
    monitor = one(objects, "ServiceMonitor", RELEASE)
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    service = one(objects, "Service", f"{RELEASE}-metrics")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9100, "targetPort": "metrics", "protocol": "TCP"}
    ]
    selector = service["spec"]["selector"]
    metered = [
        o
        for o in objects
        if o["kind"] == "Deployment"
        and selector.items() <= o["spec"]["template"]["metadata"]["labels"].items()
    ]
    assert len(metered) == len(CONTROL_PLANE)
