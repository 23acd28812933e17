"""A Kubernetes API server on loopback for tests, whose pods run on the local Docker Engine.

It speaks the real server's wire format for exactly what the Kubernetes backend calls:
core/v1 pods (create, read, list, watch, delete, exec, log), persistentvolumeclaims
(create, read, list, delete), secrets (create, read, delete; a container's env may take a
key of one) and services (read): JSON objects with server-side defaults,
Status error bodies with the real codes, reasons and messages, label and field selectors,
a global resourceVersion stamped on every change, watches that replay from a version and
answer an expired one with a 410 Expired ERROR event, and the exec WebSocket with the
v5/v4 channel protocols. Every other path is 404, every other method 405, and a pod field
it does not model is refused (422, "not modelled by the fake") rather than ignored, so a
backend call the fake lacks fails loudly instead of passing for the wrong reason.

One kubelet thread per pod runs it on Docker as a node would with restartPolicy Never: an
infra container owns the network (and IPC) namespace on the given Docker network (its
address is the pod IP), the init containers run in order, each to exit 0, then the app
containers join that namespace; emptyDirs and claims are Docker volumes. Docker's event
stream keeps each pod's status current, so a container killed behind the fake's back
shows up as it would on a node.

What it does not model is listed in docs/decisions.md ("The fake Kubernetes API server
models ...").
"""

import asyncio
import base64
import collections
import concurrent.futures
import contextlib
import copy
import io
import json
import logging
import math
import os
import queue
import re
import secrets
import socket
import struct
import tarfile
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from pathlib import Path

import docker
from aiohttp import WSMsgType, web
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.types import Mount

logger = logging.getLogger(__name__)

LABEL = "org.quor.fake-kubernetes"  # = the instance id, on every Docker object it makes
CHANNEL_PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")
STDIN, STDOUT, STDERR, STATUS, CLOSE = 0, 1, 2, 3, 255  # 4 (resize) is ignored: no tty size
NODE_NAME = "fake-node"
HISTORY_LIMIT = 10_000
DEFAULT_WATCH_TIMEOUT_S = 1800
REFRESH_S = 2  # a kubelet also looks at its containers this often (events may be late)
# The "kubernetes" Service every container learns of, whatever enableServiceLinks says.
KUBERNETES_SERVICE_IP = "10.96.0.1"
EVICTION_MESSAGE = (
    "The node was low on resource: memory. Threshold quantity: 100Mi, available: 0Ki. "
)
# Pod sysctls the kubelet allows without --allowed-unsafe-sysctls (Kubernetes 1.32+).
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ping_group_range",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.tcp_wmem",
}
NOT_MODELLED = "not modelled by the fake Kubernetes API server (tests/kubernetes_api.py)"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _docker_time(value: str) -> str:
    """Docker's RFC 3339 with nanoseconds, as Kubernetes writes it: to the second."""
    return value[:19] + "Z" if value and not value.startswith("0001") else None


# --- errors: metav1.Status -----------------------------------------------------------------


class ApiError(Exception):
    """An error the server answers with a Status body (apimachinery's StatusError)."""

    def __init__(self, code: int, reason: str, message: str, details: dict | None = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> dict:
        body = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
        }
        if self.details is not None:
            body["details"] = self.details
        body["code"] = self.code
        return body


def not_found(resource: str, name: str) -> ApiError:
    return ApiError(
        404, "NotFound", f'{resource} "{name}" not found', {"name": name, "kind": resource}
    )


def already_exists(resource: str, name: str) -> ApiError:
    details = {"name": name, "kind": resource}
    return ApiError(409, "AlreadyExists", f'{resource} "{name}" already exists', details)


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def gone(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


def _quote(value) -> str:
    """A value as Go's %q / %v print it in field errors."""
    return json.dumps(value) if isinstance(value, str) else json.dumps(value).lower()


class FieldErrors:
    """field.ErrorList: collected, then raised as one 422 Invalid."""

    def __init__(self):
        self.items: list[tuple[str, str, str]] = []  # (cause reason, field, message)

    def required(self, field: str, detail: str = "") -> None:
        self.items.append(
            ("FieldValueRequired", field, "Required value" + (f": {detail}" if detail else ""))
        )

    def invalid(self, field: str, value, detail: str) -> None:
        self.items.append(("FieldValueInvalid", field, f"Invalid value: {_quote(value)}: {detail}"))

    def forbidden(self, field: str, detail: str) -> None:
        self.items.append(("FieldValueForbidden", field, f"Forbidden: {detail}"))

    def not_modelled(self, field: str) -> None:
        self.forbidden(field, NOT_MODELLED)

    def not_supported(self, field: str, value, supported: list[str]) -> None:
        allowed = ", ".join(_quote(s) for s in supported)
        self.items.append(
            (
                "FieldValueNotSupported",
                field,
                f"Unsupported value: {_quote(value)}: supported values: {allowed}",
            )
        )

    def duplicate(self, field: str, value) -> None:
        self.items.append(("FieldValueDuplicate", field, f"Duplicate value: {_quote(value)}"))

    def not_found(self, field: str, value) -> None:
        self.items.append(("FieldValueNotFound", field, f"Not found: {_quote(value)}"))

    def raise_if_any(self, kind: str, name: str) -> None:
        if not self.items:
            return
        parts = [f"{field}: {message}" for _, field, message in self.items]
        summary = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
        causes = [
            {"reason": reason, "message": message, "field": field}
            for reason, field, message in self.items
        ]
        raise ApiError(
            422,
            "Invalid",
            f'{kind} "{name}" is invalid: {summary}',
            {"name": name, "kind": kind, "causes": causes},
        )


# --- names, labels, quantities ----------------------------------------------------------

DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]\Z")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?\Z")
ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*\Z")
SUBDOMAIN_MESSAGE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
    "'-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', "
    "regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
LABEL_MESSAGE = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', "
    "regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
LABEL_VALUE_MESSAGE = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' "
    "or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "
    "'my_value',  or '12345', regex used for validation is "
    "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)
QUALIFIED_NAME_MESSAGE = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and "
    "end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex "
    "used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)


def _check_subdomain(errors: FieldErrors, field: str, value) -> None:
    if not isinstance(value, str) or not DNS1123_SUBDOMAIN.match(value):
        errors.invalid(field, value, SUBDOMAIN_MESSAGE)
    elif len(value) > 253:
        errors.invalid(field, value, "must be no more than 253 characters")


def _check_dns_label(errors: FieldErrors, field: str, value) -> None:
    if not isinstance(value, str) or not DNS1123_LABEL.match(value):
        errors.invalid(field, value, LABEL_MESSAGE)
    elif len(value) > 63:
        errors.invalid(field, value, "must be no more than 63 characters")


def _check_labels(errors: FieldErrors, field: str, labels) -> None:
    if labels is None:
        return
    if not isinstance(labels, dict):
        raise bad_request(f"json: cannot unmarshal into Go struct field {field} of type map")
    for key, value in labels.items():
        prefix, _, name = key.rpartition("/")
        if prefix:
            _check_subdomain(errors, field, prefix)
        if not QUALIFIED_NAME.match(name):
            errors.invalid(field, key, QUALIFIED_NAME_MESSAGE)
        elif len(name) > 63:
            errors.invalid(field, key, "name part must be no more than 63 characters")
        if not isinstance(value, str):
            raise bad_request(f"json: cannot unmarshal into Go struct field {field} of type string")
        if len(value) > 63:
            errors.invalid(field, value, "must be no more than 63 characters")
        elif not LABEL_VALUE.match(value):
            errors.invalid(field, value, LABEL_VALUE_MESSAGE)


QUANTITY = re.compile(r"([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)\Z")
DECIMAL_SUFFIXES = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
BINARY_SUFFIXES = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
DECIMAL_SUFFIX_OF = {exponent: suffix for suffix, exponent in DECIMAL_SUFFIXES.items()}
BINARY_SUFFIX_OF = {exponent: suffix for suffix, exponent in BINARY_SUFFIXES.items()}


def parse_quantity(value) -> tuple[Fraction, bool]:
    """(value, binary): a resource.Quantity; ApiError 400 as its JSON decoding gives."""
    text = str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value
    match = QUANTITY.match(text) if isinstance(text, str) else None
    if match is None:
        raise bad_request(
            "quantities must match the regular expression "
            "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
        )
    number, suffix = match.groups()
    try:
        mantissa = Fraction(number)
    except ValueError:
        raise bad_request(f"unable to parse quantity's suffix: {value!r}") from None
    if suffix in BINARY_SUFFIXES:
        return mantissa * 2 ** BINARY_SUFFIXES[suffix], True
    if suffix in DECIMAL_SUFFIXES:
        return mantissa * Fraction(10) ** DECIMAL_SUFFIXES[suffix], False
    if suffix[:1] in ("e", "E") and re.fullmatch(r"[-+]?[0-9]+", suffix[1:]):
        return mantissa * Fraction(10) ** int(suffix[1:]), False
    raise bad_request(f"unable to parse quantity's suffix: {value!r}")


def canonical_quantity(value) -> str:
    """The form the server gives back (Quantity.String): "1000m" is "1", "1024Mi" "1Gi"."""
    amount, binary = parse_quantity(value)
    if binary and amount.denominator == 1 and abs(amount) >= 1024:
        number, exponent = int(amount), 0
        while number % 1024 == 0 and exponent < 60:
            number, exponent = number // 1024, exponent + 10
        return f"{number}{BINARY_SUFFIX_OF[exponent]}"
    number, exponent = math.ceil(amount * 10**9), -9
    if number == 0:
        return "0"
    while number % 1000 == 0 and exponent < 18:
        number, exponent = number // 1000, exponent + 3
    return f"{number}{DECIMAL_SUFFIX_OF[exponent]}"


# --- selectors -----------------------------------------------------------------------------


def parse_label_selector(text: str):
    """A predicate over labels for a labelSelector: `a=b`, `a==b`, `a!=b`, `a`, `!a`,
    `a in (x,y)`, `a notin (x,y)`, comma-separated (all must hold)."""
    requirements = []
    for raw in _split_selector(text):
        part = raw.strip()
        if not part:
            raise bad_request(
                f"unable to parse requirement: found '', expected: identifier in {text!r}"
            )
        set_match = re.fullmatch(r"(\S+)\s+(in|notin)\s+\(([^()]*)\)", part)
        if set_match:
            key, operator, values = set_match.groups()
            requirements.append((key, operator, {v.strip() for v in values.split(",")}))
        elif part.startswith("!"):
            requirements.append((part[1:].strip(), "!", None))
        elif "!=" in part:
            key, value = part.split("!=", 1)
            requirements.append((key.strip(), "!=", value.strip()))
        elif "==" in part:
            key, value = part.split("==", 1)
            requirements.append((key.strip(), "=", value.strip()))
        elif "=" in part:
            key, value = part.split("=", 1)
            requirements.append((key.strip(), "=", value.strip()))
        else:
            requirements.append((part, "exists", None))
    for key, _, _ in requirements:
        _, _, name = key.rpartition("/")
        if not QUALIFIED_NAME.match(name):
            raise bad_request(
                f"unable to parse requirement: <nil>: Invalid value: {_quote(key)}: "
                + QUALIFIED_NAME_MESSAGE
            )

    def matches(labels: dict) -> bool:
        for key, operator, value in requirements:
            present = key in labels
            if operator == "=" and labels.get(key) != value:
                return False
            if operator == "!=" and present and labels[key] == value:
                return False
            if operator == "exists" and not present:
                return False
            if operator == "!" and present:
                return False
            if operator == "in" and labels.get(key) not in value:
                return False
            if operator == "notin" and present and labels[key] in value:
                return False
        return True

    return matches


def _split_selector(text: str) -> list[str]:
    parts, depth, current = [], 0, []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


FIELD_GETTERS = {
    "pods": {
        "metadata.name": lambda o: o["metadata"]["name"],
        "metadata.namespace": lambda o: o["metadata"]["namespace"],
        "spec.nodeName": lambda o: o["spec"].get("nodeName", ""),
        "spec.restartPolicy": lambda o: o["spec"].get("restartPolicy", ""),
        "status.phase": lambda o: o["status"].get("phase", ""),
        "status.podIP": lambda o: o["status"].get("podIP", ""),
    },
    "persistentvolumeclaims": {
        "metadata.name": lambda o: o["metadata"]["name"],
        "metadata.namespace": lambda o: o["metadata"]["namespace"],
    },
}


def parse_field_selector(resource: str, text: str):
    getters = FIELD_GETTERS[resource]
    requirements = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        match = re.fullmatch(r"([^=!]+)(==|=|!=)(.*)", part)
        if match is None:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{part}'")
        field, operator, value = match.groups()
        if field not in getters:
            raise bad_request(f"field label not supported: {field}")
        requirements.append((getters[field], operator != "!=", value))
    return lambda obj: all((get(obj) == value) == equal for get, equal, value in requirements)


# --- the store: objects, resourceVersion, history, watchers -----------------------------------


class _Watcher:
    """One watch request: events reach its asyncio queue from any thread."""

    def __init__(self, loop, resource: str, namespace: str, accepts):
        self.loop, self.resource, self.namespace, self.accepts = loop, resource, namespace, accepts
        self.queue: asyncio.Queue = asyncio.Queue()

    def wants(self, resource: str, namespace: str, obj: dict) -> bool:
        return resource == self.resource and namespace == self.namespace and self.accepts(obj)

    def offer(self, event: tuple[str, dict]) -> None:
        with contextlib.suppress(RuntimeError):  # the server has stopped
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)


class _Store:
    """etcd plus the watch cache. Objects are snapshots: never changed in place, replaced
    by a changed copy with the next resourceVersion."""

    def __init__(self):
        self.lock = threading.RLock()
        self.objects: dict[tuple[str, str, str], dict] = {}
        self.revision = 1
        self.history: collections.deque = collections.deque(maxlen=HISTORY_LIMIT)
        self.oldest = self.revision  # a watch can start from any version >= this one
        self.watchers: set[_Watcher] = set()

    def get(self, resource: str, namespace: str, name: str) -> dict | None:
        with self.lock:
            return self.objects.get((resource, namespace, name))

    def select(self, resource: str, namespace: str, accepts) -> tuple[list[dict], int]:
        with self.lock:
            items = [
                obj
                for (kind, ns, _), obj in sorted(self.objects.items())
                if kind == resource and ns == namespace and accepts(obj)
            ]
            return items, self.revision

    def create(self, resource: str, obj: dict) -> dict:
        meta = obj["metadata"]
        with self.lock:
            key = (resource, meta["namespace"], meta["name"])
            if key in self.objects:
                raise already_exists(resource, meta["name"])
            self._stamp(obj)
            self.objects[key] = obj
            self._emit("ADDED", resource, obj)
            return obj

    def update(self, resource: str, namespace: str, name: str, change) -> dict | None:
        """Applies `change` to a copy; a new version only if something changed."""
        with self.lock:
            current = self.objects.get((resource, namespace, name))
            if current is None:
                return None
            changed = copy.deepcopy(current)
            change(changed)
            if changed == current:
                return current
            self._stamp(changed)
            self.objects[(resource, namespace, name)] = changed
            self._emit("MODIFIED", resource, changed)
            return changed

    def delete(self, resource: str, namespace: str, name: str) -> dict | None:
        with self.lock:
            current = self.objects.pop((resource, namespace, name), None)
            if current is None:
                return None
            final = copy.deepcopy(current)
            self._stamp(final)
            self._emit("DELETED", resource, final)
            return final

    def _stamp(self, obj: dict) -> None:
        self.revision += 1
        obj["metadata"]["resourceVersion"] = str(self.revision)

    def _emit(self, kind: str, resource: str, obj: dict) -> None:
        if len(self.history) == self.history.maxlen:
            self.oldest = self.history[0][0]
        namespace = obj["metadata"]["namespace"]
        self.history.append((self.revision, kind, resource, namespace, obj))
        for watcher in self.watchers:
            if watcher.wants(resource, namespace, obj):
                watcher.offer((kind, obj))

    def watch(self, watcher: _Watcher, resource_version: str) -> list[tuple[str, dict]]:
        """Registers the watcher; the events it missed since `resource_version` (or
        every current object as ADDED, for no version or "0")."""
        with self.lock:
            if resource_version in ("", "0"):
                initial = [
                    ("ADDED", obj)
                    for (kind, ns, _), obj in sorted(self.objects.items())
                    if watcher.wants(kind, ns, obj)
                ]
            else:
                try:
                    since = int(resource_version)
                except ValueError:
                    raise bad_request(f"invalid resource version: {resource_version}") from None
                if since < self.oldest:
                    raise gone(f"too old resource version: {since} ({self.revision})")
                initial = [
                    (kind, obj)
                    for revision, kind, resource, ns, obj in self.history
                    if revision > since and watcher.wants(resource, ns, obj)
                ]
            self.watchers.add(watcher)
            return initial

    def unwatch(self, watcher: _Watcher) -> None:
        with self.lock:
            self.watchers.discard(watcher)

    def expire_history(self) -> None:
        with self.lock:
            self.history.clear()
            self.oldest = self.revision


# --- pods: decoding, validation, defaults ------------------------------------------------------

POD_SPEC_FIELDS = {
    # modelled
    "containers", "initContainers", "volumes", "restartPolicy", "terminationGracePeriodSeconds",
    "securityContext", "hostname", "hostAliases", "dnsPolicy", "dnsConfig",
    "automountServiceAccountToken", "enableServiceLinks", "hostNetwork", "hostPID", "hostIPC",
    "shareProcessNamespace", "runtimeClassName", "setHostnameAsFQDN", "os",
    # scheduling and accounts: accepted, nothing to do on one node (decisions.md)
    "serviceAccountName", "serviceAccount", "nodeSelector", "tolerations", "affinity",
    "priorityClassName", "priority", "preemptionPolicy", "schedulerName", "nodeName",
    "topologySpreadConstraints", "imagePullSecrets", "subdomain", "overhead", "hostUsers",
}  # fmt: skip
CONTAINER_FIELDS = {
    "name", "image", "imagePullPolicy", "command", "args", "env", "workingDir",
    "securityContext", "resources", "volumeMounts", "ports", "terminationMessagePath",
    "terminationMessagePolicy", "stdin", "stdinOnce", "tty", "resizePolicy",
}  # fmt: skip
CONTAINER_SECURITY_FIELDS = {
    "runAsUser", "runAsGroup", "runAsNonRoot", "privileged", "allowPrivilegeEscalation",
    "readOnlyRootFilesystem", "capabilities", "seccompProfile", "procMount",
    "appArmorProfile", "windowsOptions",
}  # fmt: skip
POD_SECURITY_FIELDS = {
    "runAsUser", "runAsGroup", "runAsNonRoot", "supplementalGroups",
    "supplementalGroupsPolicy", "fsGroup", "fsGroupChangePolicy", "sysctls", "seccompProfile",
    "appArmorProfile", "windowsOptions", "seLinuxChangePolicy",
}  # fmt: skip
CAPABILITY = re.compile(r"(CAP_)?[A-Z_]+\Z")
SYSCTL_NAME = re.compile(r"([a-z0-9]([-_a-z0-9]*[a-z0-9])?[\./])*[a-z0-9]([-_a-z0-9]*[a-z0-9])?")


def _decode(raw: bytes, kind: str) -> dict:
    """The request body as the server's decoder sees it (400 when it cannot)."""
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise bad_request(
            f"the object provided is unrecognized (must be of type {kind}): couldn't get "
            f"version/kind; json parse error: {exc}"
        ) from None
    if not isinstance(body, dict):
        raise bad_request(
            f"the object provided is unrecognized (must be of type {kind}): couldn't get "
            "version/kind; json parse error: json: cannot unmarshal into Go value of type "
            'struct { APIVersion string "json:\\"apiVersion,omitempty\\""; Kind string '
            '"json:\\"kind,omitempty\\"" }'
        )
    body_kind, api_version = body.get("kind", kind), body.get("apiVersion", "v1")
    if api_version != "v1":
        raise bad_request(
            f'no kind "{body_kind}" is registered for version "{api_version}" in scheme '
            '"pkg/api/legacyscheme/scheme.go:30"'
        )
    if body_kind != kind:
        raise bad_request(
            f'{body_kind} in version "v1" cannot be handled as a {kind}: converting '
            f"(v1.{body_kind}) to (core.{kind}): unknown conversion"
        )
    for field, expected in (("metadata", dict), ("spec", dict)):
        if field in body and not isinstance(body[field], expected):
            raise bad_request(
                f'{kind} in version "v1" cannot be handled as a {kind}: json: cannot '
                f"unmarshal into Go struct field {kind}.{field} of type"
            )
    return body


def _expect(value, expected, field: str, kind: str = "Pod"):
    if value is not None and not isinstance(value, expected):
        raise bad_request(
            f'{kind} in version "v1" cannot be handled as a {kind}: json: cannot unmarshal '
            f"into Go struct field {field} of type {getattr(expected, '__name__', expected)}"
        )
    return value


def _new_metadata(body: dict, namespace: str, kind: str) -> dict:
    meta = dict(body.get("metadata") or {})
    if meta.get("namespace", namespace) != namespace:
        raise bad_request(
            "the namespace of the provided object does not match the namespace sent on the request"
        )
    if not meta.get("name") and meta.get("generateName"):
        alphabet = "bcdfghjklmnpqrstvwxz2456789"
        meta["name"] = meta["generateName"] + "".join(secrets.choice(alphabet) for _ in range(5))
    meta.pop("resourceVersion", None)
    meta.pop("deletionTimestamp", None)
    meta.update(namespace=namespace, uid=str(uuid.uuid4()), creationTimestamp=_now())
    return meta


def _check_metadata(errors: FieldErrors, meta: dict) -> None:
    if not meta.get("name"):
        errors.required("metadata.name", "name or generateName is required")
    else:
        _check_subdomain(errors, "metadata.name", meta["name"])
    _check_labels(errors, "metadata.labels", meta.get("labels"))


def new_pod(body: dict, namespace: str) -> dict:
    """The stored pod: the body after the server's defaulting and validation."""
    meta = _new_metadata(body, namespace, "Pod")
    spec = copy.deepcopy(_expect(body.get("spec"), dict, "Pod.spec") or {})
    _default_pod_spec(spec)
    errors = FieldErrors()
    _check_metadata(errors, meta)
    _validate_pod_spec(errors, spec)
    errors.raise_if_any("Pod", meta.get("name", ""))
    runtime_class = spec.get("runtimeClassName")
    if runtime_class:
        raise ApiError(
            403,
            "Forbidden",
            f'pods "{meta["name"]}" is forbidden: pod rejected: RuntimeClass "{runtime_class}" '
            "not found",
            {"name": meta["name"], "kind": "pods"},
        )
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": meta,
        "spec": spec,
        "status": {"phase": "Pending", "qosClass": _qos_class(spec)},
    }


def _default_pod_spec(spec: dict) -> None:
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("securityContext", {})
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("serviceAccountName", spec.get("serviceAccount", "default"))
    spec["serviceAccount"] = spec["serviceAccountName"]
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("priority", 0)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    tolerations = _expect(spec.setdefault("tolerations", []), list, "PodSpec.tolerations")
    for taint in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
        if not any(t.get("key") == taint for t in tolerations if isinstance(t, dict)):
            tolerations.append(
                {
                    "key": taint,
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                }
            )
    for field in ("initContainers", "containers"):
        for container in _expect(spec.get(field), list, f"PodSpec.{field}") or []:
            _expect(container, dict, f"PodSpec.{field}")
            _default_container(container)
    for volume in _expect(spec.get("volumes"), list, "PodSpec.volumes") or []:
        _expect(volume, dict, "PodSpec.volumes")
        if isinstance(volume.get("emptyDir"), dict) and "sizeLimit" in volume["emptyDir"]:
            volume["emptyDir"]["sizeLimit"] = canonical_quantity(volume["emptyDir"]["sizeLimit"])


def _default_container(container: dict) -> None:
    image = container.get("image") or ""
    tagged = ":" in image.rsplit("/", 1)[-1] or "@" in image
    latest = not tagged or image.endswith(":latest")
    container.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
    container.setdefault("terminationMessagePath", "/dev/termination-log")
    container.setdefault("terminationMessagePolicy", "File")
    resources = _expect(container.setdefault("resources", {}), dict, "Container.resources")
    for part in ("limits", "requests"):
        amounts = _expect(resources.get(part), dict, f"ResourceRequirements.{part}")
        if amounts:
            resources[part] = {k: canonical_quantity(v) for k, v in amounts.items()}
    if resources.get("limits"):
        requests = resources.setdefault("requests", {})
        for name, amount in resources["limits"].items():
            requests.setdefault(name, amount)


def _validate_pod_spec(errors: FieldErrors, spec: dict) -> None:
    for field in sorted(set(spec) - POD_SPEC_FIELDS):
        errors.not_modelled(f"spec.{field}")
    if spec["restartPolicy"] not in ("Always", "OnFailure", "Never"):
        errors.not_supported(
            "spec.restartPolicy", spec["restartPolicy"], ["Always", "OnFailure", "Never"]
        )
    elif spec["restartPolicy"] != "Never":
        errors.forbidden("spec.restartPolicy", f"only Never is {NOT_MODELLED}")
    for field in (
        "hostNetwork",
        "hostPID",
        "hostIPC",
        "shareProcessNamespace",
        "setHostnameAsFQDN",
    ):
        if spec.get(field):
            errors.forbidden(f"spec.{field}", f"true is {NOT_MODELLED}")
    if spec.get("automountServiceAccountToken") is not False:
        errors.forbidden(
            "spec.automountServiceAccountToken",
            f"a mounted service account token (anything but false) is {NOT_MODELLED}",
        )
    if spec.get("os") not in (None, {"name": "linux"}):
        errors.not_modelled("spec.os")
    if spec["dnsPolicy"] not in ("ClusterFirst", "Default", "None", "ClusterFirstWithHostNet"):
        errors.not_supported(
            "spec.dnsPolicy",
            spec["dnsPolicy"],
            ["ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"],
        )
    if "hostname" in spec:
        _check_dns_label(errors, "spec.hostname", spec["hostname"])
    for i, alias in enumerate(_expect(spec.get("hostAliases"), list, "PodSpec.hostAliases") or []):
        try:
            socket.inet_pton(
                socket.AF_INET6 if ":" in alias.get("ip", "") else socket.AF_INET,
                alias.get("ip", ""),
            )
        except (OSError, TypeError):
            errors.invalid(
                f"spec.hostAliases[{i}].ip",
                alias.get("ip", ""),
                "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
            )
        for j, hostname in enumerate(alias.get("hostnames") or []):
            _check_subdomain(errors, f"spec.hostAliases[{i}].hostnames[{j}]", hostname)
    _validate_pod_security(errors, spec["securityContext"])
    volumes = _validate_volumes(errors, spec.get("volumes") or [])
    if not spec.get("containers"):
        errors.required("spec.containers")
    names: set[str] = set()
    for field in ("initContainers", "containers"):
        for i, container in enumerate(spec.get(field) or []):
            _validate_container(errors, f"spec.{field}[{i}]", container, volumes, names)


def _validate_pod_security(errors: FieldErrors, context: dict) -> None:
    _expect(context, dict, "PodSpec.securityContext")
    for field in sorted(set(context) - POD_SECURITY_FIELDS):
        errors.not_modelled(f"spec.securityContext.{field}")
    if context.get("supplementalGroupsPolicy") not in (None, "Merge"):
        errors.not_modelled("spec.securityContext.supplementalGroupsPolicy")
    _validate_ids(errors, "spec.securityContext", context)
    _validate_seccomp(errors, "spec.securityContext.seccompProfile", context.get("seccompProfile"))
    for i, sysctl in enumerate(context.get("sysctls") or []):
        name = sysctl.get("name", "")
        if len(name) > 253 or not SYSCTL_NAME.fullmatch(name):
            errors.invalid(
                f"spec.securityContext.sysctls[{i}].name",
                name,
                f"must have at most 253 characters and match regex ^{SYSCTL_NAME.pattern}$",
            )


def _validate_ids(errors: FieldErrors, field: str, context: dict) -> None:
    for key in ("runAsUser", "runAsGroup", "fsGroup"):
        value = context.get(key)
        if value is not None and (not isinstance(value, int) or not 0 <= value <= 2147483647):
            errors.invalid(f"{field}.{key}", value, "must be between 0 and 2147483647, inclusive")
    for i, group in enumerate(context.get("supplementalGroups") or []):
        if not isinstance(group, int) or not 0 <= group <= 2147483647:
            errors.invalid(
                f"{field}.supplementalGroups[{i}]",
                group,
                "must be between 0 and 2147483647, inclusive",
            )


def _validate_seccomp(errors: FieldErrors, field: str, profile) -> None:
    if profile is None:
        return
    kind = profile.get("type")
    if kind not in ("RuntimeDefault", "Unconfined", "Localhost"):
        errors.not_supported(f"{field}.type", kind, ["Localhost", "RuntimeDefault", "Unconfined"])
    elif kind == "Localhost":
        errors.forbidden(f"{field}.type", f"Localhost is {NOT_MODELLED}")


def _validate_volumes(errors: FieldErrors, volumes: list) -> dict[str, dict]:
    known: dict[str, dict] = {}
    for i, volume in enumerate(volumes):
        field = f"spec.volumes[{i}]"
        _check_dns_label(errors, f"{field}.name", volume.get("name"))
        if volume.get("name") in known:
            errors.duplicate(f"{field}.name", volume["name"])
        known[volume.get("name")] = volume
        sources = [key for key in volume if key != "name"]
        if not sources:
            errors.required(field, "must specify a volume type")
        elif len(sources) > 1:
            errors.forbidden(f"{field}.{sources[1]}", "may not specify more than 1 volume type")
        elif sources[0] == "hostPath":
            errors.forbidden(
                f"{field}.hostPath",
                f"hostPath volumes are {NOT_MODELLED}: they would mount the test host",
            )
        elif sources[0] == "emptyDir":
            empty_dir = volume["emptyDir"] or {}
            if empty_dir.get("medium", "") not in ("", "Memory"):
                errors.forbidden(
                    f"{field}.emptyDir.medium", f"{empty_dir['medium']} is {NOT_MODELLED}"
                )
        elif sources[0] == "persistentVolumeClaim":
            claim = volume["persistentVolumeClaim"] or {}
            if not claim.get("claimName"):
                errors.required(f"{field}.persistentVolumeClaim.claimName")
        else:
            errors.forbidden(f"{field}.{sources[0]}", f"{sources[0]} volumes are {NOT_MODELLED}")
    return known


def _validate_container(
    errors: FieldErrors, field: str, container: dict, volumes: dict, names: set
) -> None:
    for key in sorted(set(container) - CONTAINER_FIELDS):
        errors.not_modelled(f"{field}.{key}")
    name = container.get("name")
    if not name:
        errors.required(f"{field}.name")
    else:
        _check_dns_label(errors, f"{field}.name", name)
        if name in names:
            errors.duplicate(f"{field}.name", name)
        names.add(name)
    if not container.get("image"):
        errors.required(f"{field}.image")
    policy = container["imagePullPolicy"]
    if policy not in ("Always", "IfNotPresent", "Never"):
        errors.not_supported(
            f"{field}.imagePullPolicy", policy, ["Always", "IfNotPresent", "Never"]
        )
    for key in ("command", "args"):
        items = _expect(container.get(key), list, f"Container.{key}") or []
        if not all(isinstance(item, str) for item in items):
            raise bad_request(
                f"json: cannot unmarshal into Go struct field Container.{key} of type string"
            )
    for i, variable in enumerate(_expect(container.get("env"), list, "Container.env") or []):
        if not ENV_NAME.match(variable.get("name") or ""):
            errors.invalid(
                f"{field}.env[{i}].name",
                variable.get("name", ""),
                "a valid environment variable name must consist of alphabetic characters, digits, "
                "'_', '-', or '.', and must not start with a digit",
            )
        source = variable.get("valueFrom")
        if source is not None:
            reference = source.get("secretKeyRef") if isinstance(source, dict) else None
            if set(source) != {"secretKeyRef"} or not isinstance(reference, dict):
                errors.not_modelled(f"{field}.env[{i}].valueFrom")
            elif set(reference) - {"name", "key"}:
                errors.not_modelled(f"{field}.env[{i}].valueFrom.secretKeyRef")
            elif not reference.get("key"):
                errors.required(f"{field}.env[{i}].valueFrom.secretKeyRef.key")
            elif "value" in variable:
                errors.invalid(
                    f"{field}.env[{i}].valueFrom",
                    "",
                    "may not be specified when `value` is not empty",
                )
    _validate_container_security(
        errors, f"{field}.securityContext", container.get("securityContext") or {}
    )
    paths: set[str] = set()
    for i, mount in enumerate(
        _expect(container.get("volumeMounts"), list, "Container.volumeMounts") or []
    ):
        mount_field = f"{field}.volumeMounts[{i}]"
        if mount.get("name") not in volumes:
            errors.not_found(f"{mount_field}.name", mount.get("name", ""))
        if not mount.get("mountPath"):
            errors.required(f"{mount_field}.mountPath")
        elif mount["mountPath"] in paths:
            errors.invalid(f"{mount_field}.mountPath", mount["mountPath"], "must be unique")
        paths.add(mount.get("mountPath"))
        for key in ("subPath", "subPathExpr"):
            if mount.get(key):
                errors.not_modelled(f"{mount_field}.{key}")
        if mount.get("mountPropagation") not in (None, "None"):
            errors.not_modelled(f"{mount_field}.mountPropagation")
        if mount.get("recursiveReadOnly") == "Enabled":
            errors.not_modelled(f"{mount_field}.recursiveReadOnly")
    for part in ("limits", "requests"):
        for resource in container["resources"].get(part) or {}:
            if resource not in ("cpu", "memory", "ephemeral-storage"):
                errors.not_modelled(f"{field}.resources.{part}[{resource}]")


def _validate_container_security(errors: FieldErrors, field: str, context: dict) -> None:
    _expect(context, dict, "Container.securityContext")
    for key in sorted(set(context) - CONTAINER_SECURITY_FIELDS):
        errors.not_modelled(f"{field}.{key}")
    _validate_ids(errors, field, context)
    _validate_seccomp(errors, f"{field}.seccompProfile", context.get("seccompProfile"))
    if context.get("procMount") not in (None, "Default"):
        errors.not_modelled(f"{field}.procMount")
    capabilities = context.get("capabilities") or {}
    for part in ("add", "drop"):
        for i, name in enumerate(capabilities.get(part) or []):
            if not isinstance(name, str) or not CAPABILITY.match(name):
                errors.invalid(f"{field}.capabilities.{part}[{i}]", name, "not a capability")
    added = {c.removeprefix("CAP_") for c in capabilities.get("add") or []}
    if context.get("allowPrivilegeEscalation") is False:
        if context.get("privileged"):
            errors.invalid(
                field, "", "cannot set `allowPrivilegeEscalation` to false and `privileged` to true"
            )
        if "SYS_ADMIN" in added:
            errors.invalid(
                field,
                "",
                "cannot set `allowPrivilegeEscalation` to false and `capabilities.Add` CAP_SYS_ADMIN",
            )


def _qos_class(spec: dict) -> str:
    containers = (spec.get("initContainers") or []) + (spec.get("containers") or [])
    resources = [c.get("resources") or {} for c in containers]
    if not any(r.get("limits") or r.get("requests") for r in resources):
        return "BestEffort"
    guaranteed = all(
        all(
            (r.get("limits") or {}).get(name) is not None
            and (r.get("requests") or {}).get(name) == (r.get("limits") or {}).get(name)
            for name in ("cpu", "memory")
        )
        for r in resources
    )
    return "Guaranteed" if guaranteed else "Burstable"


def new_claim(body: dict, namespace: str) -> dict:
    meta = _new_metadata(body, namespace, "PersistentVolumeClaim")
    spec = copy.deepcopy(
        _expect(body.get("spec"), dict, "PersistentVolumeClaim.spec", "PersistentVolumeClaim") or {}
    )
    errors = FieldErrors()
    _check_metadata(errors, meta)
    modes = spec.get("accessModes") or []
    supported = ["ReadOnlyMany", "ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod"]
    if not modes:
        errors.required("spec.accessModes", "at least 1 access mode is required")
    for mode in modes:
        if mode not in supported:
            errors.not_supported("spec.accessModes", mode, supported)
    requests = ((spec.get("resources") or {}).get("requests")) or {}
    if "storage" not in requests:
        errors.required("spec.resources[storage]")
    else:
        requests["storage"] = canonical_quantity(requests["storage"])
    for key in ("dataSource", "dataSourceRef", "selector", "volumeAttributesClassName"):
        if spec.get(key):
            errors.not_modelled(f"spec.{key}")
    if spec.get("volumeMode", "Filesystem") != "Filesystem":
        errors.not_modelled("spec.volumeMode")
    errors.raise_if_any("PersistentVolumeClaim", meta.get("name", ""))
    spec.setdefault("volumeMode", "Filesystem")
    spec.setdefault("storageClassName", "standard")  # the DefaultStorageClass admission plugin
    meta["finalizers"] = [*meta.get("finalizers", []), "kubernetes.io/pvc-protection"]
    return {
        "kind": "PersistentVolumeClaim",
        "apiVersion": "v1",
        "metadata": meta,
        "spec": spec,
        "status": {"phase": "Pending"},
    }


def new_secret(body: dict, namespace: str) -> dict:
    """The stored Secret: `stringData` merged into `data`, every value base64."""
    meta = _new_metadata(body, namespace, "Secret")
    errors = FieldErrors()
    _check_metadata(errors, meta)
    data = dict(_expect(body.get("data"), dict, "Secret.data", "Secret") or {})
    for key, value in data.items():
        try:
            base64.b64decode(value, validate=True)
        except (TypeError, ValueError):
            raise bad_request(
                f"json: cannot unmarshal into Go struct field Secret.data of type []uint8 ({key})"
            ) from None
    for key, value in (_expect(body.get("stringData"), dict, "Secret.stringData") or {}).items():
        data[key] = base64.b64encode(str(value).encode()).decode()
    if body.get("immutable"):
        errors.not_modelled("immutable")
    errors.raise_if_any("Secret", meta.get("name", ""))
    return {
        "kind": "Secret",
        "apiVersion": "v1",
        "metadata": meta,
        "type": body.get("type") or "Opaque",
        "data": data,
    }


# --- the kubelet: one thread per pod -----------------------------------------------------------


class _Deleted(Exception):
    def __init__(self, grace: int, removed: bool):
        super().__init__(grace)
        self.grace, self.removed = grace, removed


class _Evicted(Exception):
    def __init__(self, done: threading.Event):
        super().__init__()
        self.done = done


class _Shutdown(Exception):
    pass


class _PodWorker:
    """What a kubelet does for one pod with restartPolicy Never, on Docker. Its thread
    is the only one that touches the pod's containers and writes its status."""

    def __init__(self, fake: "FakeKubernetes", pod: dict):
        self.fake, self.docker = fake, fake.docker
        meta = pod["metadata"]
        self.namespace, self.name, self.uid = meta["namespace"], meta["name"], meta["uid"]
        self.spec = pod["spec"]
        self.qos = pod["status"]["qosClass"]
        self.prefix = f"{self.name}_{self.namespace}_{self.uid[:8]}"
        self.inbox: queue.Queue = queue.Queue()
        self.infra_id = ""
        self.facts: dict[str, dict] = {}  # container -> {"id": ..} or {"waiting": {..}}
        self.volumes: dict[str, str] = {}  # pod volume -> Docker volume
        self.made_volumes: list[str] = []  # the emptyDirs, removed with the pod
        self.held_volumes: list[str] = []  # the tmpfs ones, kept mounted by the infra container
        self.pod_ip = self.start_time = ""
        self.scheduled = ("False", "", "")
        self.failure: tuple[str, str] | None = None  # pod-level reason and message
        self.disruption: tuple[str, str] | None = None
        self.transitions: dict[str, tuple[str, str]] = {}
        self.thread = threading.Thread(
            target=self.run, name=f"fake-kubelet {self.namespace}/{self.name}", daemon=True
        )

    @property
    def containers(self) -> list[dict]:
        return self.spec["containers"]

    @property
    def init_containers(self) -> list[dict]:
        return self.spec.get("initContainers") or []

    def container_id(self, name: str) -> str:
        return self.facts.get(name, {}).get("id", "")

    def labels(self, **extra: str) -> dict[str, str]:
        return {
            LABEL: self.fake.instance,
            f"{LABEL}.namespace": self.namespace,
            f"{LABEL}.pod": self.name,
            f"{LABEL}.pod-uid": self.uid,
            **{f"{LABEL}.{key}": value for key, value in extra.items()},
        }

    # --- messages ------------------------------------------------------------------------

    def _receive(self, timeout: float | None = None):
        try:
            message = self.inbox.get(timeout=timeout)
        except queue.Empty:
            return None
        if message[0] == "delete":
            raise _Deleted(message[1], message[2])
        if message[0] == "evict":
            raise _Evicted(message[1])
        if message[0] == "shutdown":
            raise _Shutdown
        return message

    def run(self) -> None:
        try:
            try:
                self._start()
            except _Evicted as evicted:
                self._evict()
                evicted.done.set()
            except (DockerException, OSError) as exc:
                logger.exception("fake kubelet: pod %s/%s", self.namespace, self.name)
                self.fake.errors.append(f"{self.namespace}/{self.name}: {exc}")
            self._idle()
        except _Deleted as deleted:
            self._terminate(deleted.grace, deleted.removed)
        except _Shutdown:
            pass
        except Exception as exc:
            logger.exception("fake kubelet: pod %s/%s", self.namespace, self.name)
            self.fake.errors.append(f"{self.namespace}/{self.name}: {exc}")

    def _idle(self) -> None:
        """Until the pod is deleted: its status follows its containers."""
        while True:
            try:
                self._receive(timeout=REFRESH_S)
                self._after_container_event()
            except _Evicted as evicted:
                if self.failure is None:
                    self._evict()
                evicted.done.set()

    def _after_container_event(self) -> None:
        if self.infra_id and self.failure is None and not self._running(self.infra_id):
            # The pod's sandbox is gone: its containers lose their network; with
            # restartPolicy Never nothing is started again.
            for container_id in self._container_ids():
                self._kill(container_id)
        self._publish()

    # --- starting ------------------------------------------------------------------------

    def _start(self) -> None:
        self._wait_for_claims()
        self.scheduled = ("True", "", "")
        self.start_time = _now()
        self.fake.store.update("pods", self.namespace, self.name, self._bind)
        self._publish()
        forbidden = [
            s["name"]
            for s in self.spec["securityContext"].get("sysctls") or []
            if s["name"] not in SAFE_SYSCTLS
        ]
        if forbidden:
            self.failure = (
                "SysctlForbidden",
                f'Pod forbidden sysctl: "{forbidden[0]}" not allowlisted',
            )
            self._publish()
            return
        image = self._infra_image()
        self._make_volumes(image)
        self._start_infra(image)
        self._publish()
        for container in self.init_containers:
            container_id = self._start_when_pulled(container)
            if not container_id:
                return
            self._wait_for_exit(container_id)
            if not _exited_zero(self._container_status(container, init=True)):
                self._kill(self.infra_id)
                self._publish()
                return
            self._publish()
        waiting = list(self.containers)
        while waiting:
            for container in list(waiting):
                if self._image_present(container["image"]):
                    self._start_container(container)
                    waiting.remove(container)
                else:
                    self._image_missing(container)
            self._publish()
            if waiting:
                self._receive(timeout=1)

    def _bind(self, pod: dict) -> None:
        pod["spec"]["nodeName"] = NODE_NAME

    def _wait_for_claims(self) -> None:
        """The scheduler binds the pod only once each claim it names is bound."""
        while True:
            problem = ""
            for volume in self.spec.get("volumes") or []:
                claim_name = (volume.get("persistentVolumeClaim") or {}).get("claimName")
                if not claim_name:
                    continue
                claim = self.fake.store.get("persistentvolumeclaims", self.namespace, claim_name)
                if claim is None:
                    problem = f'persistentvolumeclaim "{claim_name}" not found'
                elif claim["metadata"].get("deletionTimestamp"):
                    problem = f'persistentvolumeclaim "{claim_name}" is being deleted'
                elif claim["status"].get("phase") != "Bound":
                    problem = "pod has unbound immediate PersistentVolumeClaims"
                else:
                    self.volumes[volume["name"]] = self.fake.claim_volume(claim)
                    continue
                break
            if not problem:
                return
            message = (
                f"0/1 nodes are available: {problem}. preemption: 0/1 nodes are available: "
                "1 Preemption is not helpful for scheduling."
            )
            self.scheduled = ("False", "Unschedulable", message)
            self._publish()
            self._receive(timeout=1)

    def _infra_image(self) -> str:
        """The infra container runs `sleep infinity` from one of the pod's images (a node
        has its pause image; this one has those)."""
        while True:
            for container in self.containers + self.init_containers:
                if self._image_present(container["image"]):
                    return container["image"]
            for container in self.init_containers[:1] or self.containers:
                self._image_missing(container)
            self._publish()
            self._receive(timeout=1)

    def _image_present(self, image: str) -> bool:
        try:
            self.docker.images.get(image)
        except ImageNotFound:
            return False
        return True

    def _image_missing(self, container: dict) -> None:
        """The fake never pulls: a missing image waits as a failed pull would."""
        image, name = container["image"], container["name"]
        if container["imagePullPolicy"] == "Never":
            waiting = {
                "reason": "ErrImageNeverPull",
                "message": f'Container image "{image}" is not present with pull policy of Never',
            }
        elif self.facts.get(name, {}).get("waiting", {}).get("reason") in (
            "ErrImagePull",
            "ImagePullBackOff",
        ):
            waiting = {"reason": "ImagePullBackOff", "message": f'Back-off pulling image "{image}"'}
        else:
            waiting = {
                "reason": "ErrImagePull",
                "message": f'failed to pull and unpack image "{image}": the fake never pulls',
            }
        self.facts[name] = {"waiting": waiting}

    def _make_volumes(self, image: str) -> None:
        """emptyDirs as Docker volumes (tmpfs for medium Memory), with the modes and group
        a kubelet gives them: 0777 (1777 on tmpfs), root's, or fsGroup's with setgid. A
        tmpfs volume is mounted while a container uses it: the infra container holds
        each one for the pod's life (as the node holds a pod's emptyDir)."""
        fs_group = self.spec["securityContext"].get("fsGroup")
        roots: list[tuple[str, int, int]] = []
        for volume in self.spec.get("volumes") or []:
            if "emptyDir" not in volume:
                if "persistentVolumeClaim" in volume and fs_group is not None:
                    roots.append((self.volumes[volume["name"]], 0o2775, fs_group))
                continue
            name = f"k8s_{volume['name']}_{self.prefix}"
            empty_dir = volume["emptyDir"] or {}
            options = {}
            if empty_dir.get("medium") == "Memory":
                mode = "3777" if fs_group is not None else "1777"
                # Mounted by the daemon on the host: owned by the host ids of the
                # containers' root (and fsGroup), as Docker's remapping maps them.
                root_uid, root_gid = self.fake.container_root
                tmpfs = [f"mode={mode}", f"uid={root_uid}", f"gid={root_gid + (fs_group or 0)}"]
                if empty_dir.get("sizeLimit"):
                    tmpfs.append(f"size={int(parse_quantity(empty_dir['sizeLimit'])[0])}")
                options = {
                    "driver_opts": {"type": "tmpfs", "device": "tmpfs", "o": ",".join(tmpfs)}
                }
                self.held_volumes.append(name)
            else:
                roots.append((name, 0o2777 if fs_group is not None else 0o777, fs_group or 0))
            self.docker.volumes.create(name, labels=self.labels(volume=volume["name"]), **options)
            self.made_volumes.append(name)
            self.volumes[volume["name"]] = name
        if roots:
            self._set_volume_roots(image, roots)

    def _set_volume_roots(self, image: str, roots: list[tuple[str, int, int]]) -> None:
        """Writes the roots' modes by unpacking one directory entry onto each through a
        container that is never started."""
        mounts = [
            Mount(f"/v/{i}", name, type="volume", no_copy=True)
            for i, (name, _, _) in enumerate(roots)
        ]
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            for i, (_, mode, gid) in enumerate(roots):
                entry = tarfile.TarInfo(str(i))
                entry.type, entry.mode, entry.uid, entry.gid = tarfile.DIRTYPE, mode, 0, gid
                entry.mtime = int(time.time())
                tar.addfile(entry)
        helper = self.docker.containers.create(
            image,
            entrypoint=["true"],
            name=f"k8s_VOLUMES_{self.prefix}",
            labels=self.labels(),
            network_mode="none",
            mounts=mounts,
        )
        try:
            helper.put_archive("/v", archive.getvalue())
        finally:
            helper.remove(force=True)

    def _start_infra(self, image: str) -> None:
        spec = self.spec
        dns = spec.get("dnsConfig") or {}
        aliases = [
            f"{hostname}:{alias['ip']}"
            for alias in spec.get("hostAliases") or []
            for hostname in alias.get("hostnames") or []
        ]
        container = self.docker.containers.create(
            image,
            entrypoint=["sleep", "infinity"],
            name=f"k8s_POD_{self.prefix}",
            hostname=spec.get("hostname") or self.name[:63].rstrip("-."),
            user="65535:65535",
            labels=self.labels(container="POD"),
            network=self.fake.docker_network,
            extra_hosts=aliases or None,
            dns=dns.get("nameservers") or None,
            dns_search=dns.get("searches") or None,
            dns_opt=[
                f"{o['name']}:{o['value']}" if o.get("value") else o["name"]
                for o in dns.get("options") or []
            ]
            or None,
            sysctls={s["name"]: s["value"] for s in spec["securityContext"].get("sysctls") or []}
            or None,
            ipc_mode="shareable",
            mounts=[
                Mount(f"/run/fake-kubernetes/{i}", name, type="volume", no_copy=True)
                for i, name in enumerate(self.held_volumes)
            ],
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            read_only=True,
            pids_limit=16,
            restart_policy={"Name": "no"},
        )
        self.infra_id = container.id
        container.start()
        container.reload()
        self.pod_ip = container.attrs["NetworkSettings"]["Networks"][self.fake.docker_network][
            "IPAddress"
        ]

    def _start_when_pulled(self, container: dict) -> str:
        while not self._image_present(container["image"]):
            self._image_missing(container)
            self._publish()
            self._receive(timeout=1)
        return self._start_container(container)

    def _start_container(self, container: dict) -> str:
        """Creates and starts one container in the pod's namespaces: its id, or "" when
        the kubelet could not (the reason is in its status)."""
        name = container["name"]
        try:
            kwargs = self._container_options(container)
        except ValueError as exc:
            self.facts[name] = {
                "waiting": {"reason": "CreateContainerConfigError", "message": str(exc)}
            }
            self._publish()
            return ""
        try:
            created = self.docker.containers.create(**kwargs)
        except APIError as exc:
            self.facts[name] = {"waiting": {"reason": "CreateContainerError", "message": str(exc)}}
            self._publish()
            return ""
        self.facts[name] = {"id": created.id}
        try:
            created.start()
        except APIError as exc:
            self.facts[name]["start_error"] = exc.explanation or str(exc)
        return created.id

    def _container_options(self, container: dict) -> dict:
        pod_context = self.spec["securityContext"]
        context = container.get("securityContext") or {}
        uid = context.get("runAsUser", pod_context.get("runAsUser"))
        gid = context.get("runAsGroup", pod_context.get("runAsGroup"))
        image_user = self.docker.images.get(container["image"]).attrs["Config"].get("User") or "0"
        image_uid = image_user.split(":")[0]
        if uid is None and gid is not None:
            user = f"{image_uid}:{gid}"
        elif uid is not None:
            user = f"{uid}:{gid}" if gid is not None else str(uid)
        else:
            user = None
        if context.get("runAsNonRoot", pod_context.get("runAsNonRoot")):
            where = (
                f'(pod: "{self.name}_{self.namespace}({self.uid})", container: {container["name"]})'
            )
            if uid is None and not image_uid.isdigit():
                raise ValueError(
                    f"container has runAsNonRoot and image has non-numeric user ({image_uid}), "
                    f"cannot verify user is non-root {where}"
                )
            if (uid if uid is not None else int(image_uid)) == 0:
                raise ValueError(f"container has runAsNonRoot and image will run as root {where}")
        groups = list(pod_context.get("supplementalGroups") or [])
        if pod_context.get("fsGroup") is not None:
            groups.append(pod_context["fsGroup"])
        capabilities = context.get("capabilities") or {}
        security = []
        profile = context.get("seccompProfile") or pod_context.get("seccompProfile") or {}
        # No profile is Unconfined: a kubelet's default (without --seccomp-default).
        if profile.get("type", "Unconfined") == "Unconfined":
            security.append("seccomp=unconfined")
        if context.get("allowPrivilegeEscalation") is False:
            security.append("no-new-privileges")
        limits = container["resources"].get("limits") or {}
        requests = container["resources"].get("requests") or {}
        options = {
            "image": container["image"],
            "name": f"k8s_{container['name']}_{self.prefix}",
            "labels": self.labels(container=container["name"]),
            "entrypoint": container.get("command") or None,
            "command": container.get("args") or None,
            "working_dir": container.get("workingDir") or None,
            "environment": self._environment(container),
            "user": user,
            "group_add": [str(g) for g in groups] or None,
            "cap_drop": capabilities.get("drop") or None,
            "cap_add": capabilities.get("add") or None,
            "privileged": bool(context.get("privileged")),
            "security_opt": security or None,
            "read_only": bool(context.get("readOnlyRootFilesystem")),
            "network_mode": f"container:{self.infra_id}",
            "ipc_mode": f"container:{self.infra_id}",
            "mounts": self._mounts(container),
            "stdin_open": bool(container.get("stdin")),
            "tty": bool(container.get("tty")),
            "restart_policy": {"Name": "no"},
        }
        if "cpu" in limits:
            options["nano_cpus"] = int(parse_quantity(limits["cpu"])[0] * 10**9)
        if "cpu" in requests:
            options["cpu_shares"] = max(2, int(parse_quantity(requests["cpu"])[0] * 1024))
        if "memory" in limits:
            options["mem_limit"] = options["memswap_limit"] = int(
                parse_quantity(limits["memory"])[0]
            )
        return options

    def _environment(self, container: dict) -> dict[str, str]:
        """What a kubelet sets: the kubernetes Service's variables, the namespace's
        Services' with enableServiceLinks, then the container's own."""
        services = [("kubernetes", KUBERNETES_SERVICE_IP, [443])]
        if self.spec.get("enableServiceLinks"):
            services += self.fake.service_links(self.namespace)
        environment = {}
        for name, ip, ports in services:
            prefix = name.upper().replace("-", "_")
            environment[f"{prefix}_SERVICE_HOST"] = ip
            environment[f"{prefix}_SERVICE_PORT"] = str(ports[0])
            if name == "kubernetes":
                environment["KUBERNETES_SERVICE_PORT_HTTPS"] = "443"
            environment[f"{prefix}_PORT"] = f"tcp://{ip}:{ports[0]}"
            for port in ports:
                base = f"{prefix}_PORT_{port}_TCP"
                environment.update(
                    {
                        base: f"tcp://{ip}:{port}",
                        f"{base}_PROTO": "tcp",
                        f"{base}_PORT": str(port),
                        f"{base}_ADDR": ip,
                    }
                )
        for variable in container.get("env") or []:
            reference = (variable.get("valueFrom") or {}).get("secretKeyRef")
            if reference is None:
                environment[variable["name"]] = variable.get("value", "")
                continue
            secret = self.fake.store.get("secrets", self.namespace, reference.get("name", ""))
            if secret is None or reference["key"] not in (secret.get("data") or {}):
                raise ValueError(  # the kubelet's CreateContainerConfigError
                    f'secret "{reference.get("name", "")}" not found'
                    if secret is None
                    else f"couldn't find key {reference['key']} in Secret {self.namespace}/"
                    f"{reference['name']}"
                )
            environment[variable["name"]] = base64.b64decode(
                secret["data"][reference["key"]]
            ).decode()
        return environment

    def _mounts(self, container: dict) -> list[Mount]:
        volumes = {v["name"]: v for v in self.spec.get("volumes") or []}
        mounts = []
        for mount in container.get("volumeMounts") or []:
            claim = volumes[mount["name"]].get("persistentVolumeClaim") or {}
            read_only = bool(mount.get("readOnly") or claim.get("readOnly"))
            mounts.append(
                Mount(
                    mount["mountPath"],
                    self.volumes[mount["name"]],
                    type="volume",
                    read_only=read_only,
                    no_copy=True,
                )
            )
        return mounts

    def _wait_for_exit(self, container_id: str) -> None:
        while self._running(container_id):
            self._receive(timeout=1)

    # --- Docker's view ----------------------------------------------------------------------

    def _state(self, container_id: str) -> dict:
        try:
            return self.docker.api.inspect_container(container_id)["State"]
        except NotFound:
            return {}

    def _running(self, container_id: str) -> bool:
        return bool(self._state(container_id).get("Running"))

    def _container_ids(self) -> list[str]:
        return [fact["id"] for fact in self.facts.values() if "id" in fact]

    def _kill(self, container_id: str) -> None:
        with contextlib.suppress(NotFound, APIError):
            self.docker.api.kill(container_id)

    # --- status ------------------------------------------------------------------------------

    def _publish(self) -> None:
        """Writes the pod's status as its containers are now (a new version only if it
        changed)."""
        try:
            status = self._status()
        except DockerException:
            logger.exception("fake kubelet: status of %s/%s", self.namespace, self.name)
            return
        self.fake.store.update(
            "pods", self.namespace, self.name, lambda pod: pod.__setitem__("status", status)
        )

    def _status(self) -> dict:
        inits = [self._container_status(c, init=True) for c in self.init_containers]
        apps = [self._container_status(c, init=False) for c in self.containers]
        phase = self._phase(inits, apps)
        status = {"phase": phase, "conditions": self._conditions(phase, inits, apps)}
        if self.failure:
            status["reason"], status["message"] = self.failure
        if self.scheduled[0] == "True":
            status["hostIP"] = self.fake.host_ip
            status["hostIPs"] = [{"ip": self.fake.host_ip}]
        if self.pod_ip:
            status["podIP"] = self.pod_ip
            status["podIPs"] = [{"ip": self.pod_ip}]
        if self.start_time:
            status["startTime"] = self.start_time
            if inits:
                status["initContainerStatuses"] = inits
            status["containerStatuses"] = apps
        status["qosClass"] = self.qos
        return status

    def _container_status(self, container: dict, *, init: bool) -> dict:
        name = container["name"]
        fact = self.facts.get(name)
        status = {
            "name": name,
            "image": container["image"],
            "imageID": "",
            "lastState": {},
            "ready": False,
            "restartCount": 0,
            "started": False,
            "state": {},
        }
        if fact is None:
            reason = "PodInitializing" if init or self.init_containers else "ContainerCreating"
            status["state"] = {"waiting": {"reason": reason}}
            return status
        if "waiting" in fact:
            status["state"] = {"waiting": fact["waiting"]}
            return status
        container_id = f"docker://{fact['id']}"
        status["containerID"] = container_id
        try:
            info = self.docker.api.inspect_container(fact["id"])
        except NotFound:
            status["state"] = {
                "terminated": {
                    "exitCode": 137,
                    "reason": "ContainerStatusUnknown",
                    "message": "The container could not be located when the pod was terminated",
                }
            }
            return status
        status["imageID"] = f"docker://{info['Image']}"
        state = info["State"]
        if state["Running"]:
            status["state"] = {"running": {"startedAt": _docker_time(state["StartedAt"])}}
            status["started"] = True
            status["ready"] = not init
        elif fact.get("start_error"):
            status["state"] = {
                "terminated": {
                    "exitCode": 128,
                    "reason": "StartError",
                    "message": fact["start_error"],
                    "startedAt": "1970-01-01T00:00:00Z",
                    "finishedAt": _docker_time(state["FinishedAt"]) or _now(),
                    "containerID": container_id,
                }
            }
        elif state["Status"] == "created":
            status["state"] = {"waiting": {"reason": "ContainerCreating"}}
        else:
            code = state["ExitCode"]
            reason = (
                "OOMKilled" if state.get("OOMKilled") else "Completed" if code == 0 else "Error"
            )
            status["state"] = {
                "terminated": {
                    "exitCode": code,
                    "reason": reason,
                    "startedAt": _docker_time(state["StartedAt"]),
                    "finishedAt": _docker_time(state["FinishedAt"]),
                    "containerID": container_id,
                }
            }
            status["ready"] = init and code == 0
        return status

    def _phase(self, inits: list[dict], apps: list[dict]) -> str:
        if self.failure:
            return "Failed"
        for status in inits:
            terminated = status["state"].get("terminated")
            if terminated and terminated["exitCode"] != 0:
                return "Failed"
        if not all(_exited_zero(s) for s in inits):
            return "Pending"
        if any("waiting" in s["state"] for s in apps):
            return "Pending"
        if all("terminated" in s["state"] for s in apps):
            return "Succeeded" if all(_exited_zero(s) for s in apps) else "Failed"
        return "Running"

    def _conditions(self, phase: str, inits: list[dict], apps: list[dict]) -> list[dict]:
        conditions = []
        sandbox_ready = bool(self.infra_id) and phase in ("Pending", "Running")
        if self.start_time:
            conditions.append(self._condition("PodReadyToStartContainers", sandbox_ready))
            incomplete = [s["name"] for s in inits if not _exited_zero(s)]
            conditions.append(
                self._condition(
                    "Initialized",
                    not incomplete,
                    "ContainersNotInitialized",
                    f"containers with incomplete status: [{' '.join(incomplete)}]",
                )
            )
            unready = [s["name"] for s in apps if not s["ready"]]
            reason = {"Succeeded": "PodCompleted", "Failed": "PodFailed"}.get(
                phase, "ContainersNotReady"
            )
            message = f"containers with unready status: [{' '.join(unready)}]"
            ready = not unready and phase == "Running"
            conditions.append(self._condition("Ready", ready, reason, message))
            conditions.append(self._condition("ContainersReady", ready, reason, message))
        if self.disruption:
            conditions.append(self._condition("DisruptionTarget", True, *self.disruption))
        status, reason, message = self.scheduled
        conditions.append(self._condition("PodScheduled", status == "True", reason, message))
        return conditions

    def _condition(self, kind: str, true: bool, reason: str = "", message: str = "") -> dict:
        status = "True" if true else "False"
        previous = self.transitions.get(kind)
        if previous is None or previous[0] != status:
            self.transitions[kind] = previous = (status, _now())
        condition = {
            "type": kind,
            "status": status,
            "lastProbeTime": None,
            "lastTransitionTime": previous[1],
        }
        if reason and (not true or kind == "DisruptionTarget"):
            condition["reason"] = reason
        if message and (not true or kind == "DisruptionTarget"):
            condition["message"] = message
        return condition

    # --- ending ----------------------------------------------------------------------------------

    def _evict(self) -> None:
        """As a kubelet under node pressure: every container killed at once, the pod
        Failed with reason Evicted (and it stays, until deleted)."""
        for container_id in [*self._container_ids(), self.infra_id]:
            if container_id:
                self._stop(container_id, 0)
        self.failure = ("Evicted", EVICTION_MESSAGE)
        self.disruption = ("TerminationByKubelet", EVICTION_MESSAGE)
        self._publish()

    def _terminate(self, grace: int, removed: bool) -> None:
        """A deleted pod: its containers stopped (SIGTERM, SIGKILL after the grace
        period), their last status written, then the containers and emptyDirs removed
        and the object with them; claims stay."""
        stoppers = [
            threading.Thread(target=self._stop, args=(container_id, grace), daemon=True)
            for container_id in self._container_ids()
            if self._running(container_id)
        ]
        for stopper in stoppers:
            stopper.start()
        for stopper in stoppers:
            stopper.join()
        if not removed:
            self._publish()
        for container_id in [*self._container_ids(), self.infra_id]:
            if container_id:
                with contextlib.suppress(NotFound):
                    self.docker.api.remove_container(container_id, force=True)
        for name in self.made_volumes:
            with contextlib.suppress(NotFound):
                self.docker.api.remove_volume(name, force=True)
        self.fake.pod_gone(self, removed)

    def _stop(self, container_id: str, grace: int) -> None:
        """SIGTERM, SIGKILL after `grace` seconds (at once for 0); returns once it ended."""
        with contextlib.suppress(NotFound, APIError):
            self.docker.api.stop(container_id, timeout=grace)


def _exited_zero(status: dict) -> bool:
    terminated = status["state"].get("terminated")
    return bool(terminated) and terminated["exitCode"] == 0


# --- exec ----------------------------------------------------------------------------------


class _ExecSession:
    """One exec WebSocket bridged to a docker exec's raw stream: channel 0 to its stdin
    (v5's close of channel 0 closes the stream's write side), Docker's frames to channels
    1 and 2 as they come, the Status on channel 3, then the close."""

    def __init__(self, fake, ws: web.WebSocketResponse, stream, exec_id: str, argv, tty: bool):
        self.fake, self.ws, self.exec_id, self.argv, self.tty = fake, ws, exec_id, argv, tty
        self.reader, self.writer = stream
        self.v5 = ws.ws_protocol == CHANNEL_PROTOCOLS[0]
        self.sent_output = False
        self.held: bytes = b""  # a first frame that may be the runtime failing to start argv

    async def run(self) -> None:
        output = asyncio.create_task(self._pump_output())
        stdin = asyncio.create_task(self._pump_stdin())
        try:
            await asyncio.wait({output, stdin}, return_when=asyncio.FIRST_COMPLETED)
            if not output.done():  # the client went away: the command is left to itself
                return
            stdin.cancel()
            await asyncio.gather(stdin, return_exceptions=True)
            failure = output.exception()
            if failure is not None:
                if not isinstance(failure, ConnectionError):  # not the client going away
                    self.fake.errors.append(f"exec {self.argv}: {failure!r}")
                return
            loop = asyncio.get_running_loop()
            code = await loop.run_in_executor(None, self.fake.exec_exit_code, self.exec_id)
            await self._send(STATUS, _dumps(self._status(code)).encode())
            await self.ws.close()
        except ConnectionError:
            pass
        finally:
            for task in (output, stdin):
                task.cancel()
            await asyncio.gather(output, stdin, return_exceptions=True)
            self.writer.close()

    async def _pump_output(self) -> None:
        if self.tty:
            while data := await self.reader.read(1 << 16):
                await self._deliver(STDOUT, data)
            return
        while True:  # Docker's frames: stream id and size in 8 bytes, then the data
            try:
                header = await self.reader.readexactly(8)
            except asyncio.IncompleteReadError as end:
                if end.partial:
                    raise
                return
            stream, size = struct.unpack(">BxxxL", header)
            payload = await self.reader.readexactly(size)
            await self._deliver(STDERR if stream == 2 else STDOUT, payload)

    async def _deliver(self, channel: int, payload: bytes) -> None:
        if (
            not self.sent_output
            and not self.held
            and payload.startswith(b"OCI runtime exec failed")
        ):
            self.held = payload
            return
        if self.held:
            held, self.held = self.held, b""
            await self._send(STDOUT, held)
        self.sent_output = True
        await self._send(channel, payload)

    async def _send(self, channel: int, payload: bytes) -> None:
        for start in range(0, max(len(payload), 1), 1 << 20):
            await self.ws.send_bytes(bytes([channel]) + payload[start : start + (1 << 20)])

    async def _pump_stdin(self) -> None:
        stdin_open = True
        async for message in self.ws:
            if message.type == WSMsgType.BINARY:
                data = message.data
            elif message.type == WSMsgType.TEXT:
                data = message.data.encode()
            else:
                continue
            if not data:
                continue
            channel, payload = data[0], data[1:]
            if channel == STDIN and stdin_open and payload:
                try:
                    self.writer.write(payload)
                    await self.writer.drain()
                except ConnectionError:  # the command is gone or closed its stdin
                    stdin_open = False
            elif channel == CLOSE and self.v5 and payload[:1] == bytes([STDIN]) and stdin_open:
                stdin_open = False
                with contextlib.suppress(OSError):
                    self.writer.write_eof()

    def _status(self, code: int) -> dict:
        if self.held and code in (126, 127):
            error = (
                "error executing command in container: failed to exec in container: failed to "
                f'start exec "{self.exec_id}": {self.held.decode(errors="replace").strip()}'
            )
            return {
                "metadata": {},
                "status": "Failure",
                "message": f"Internal error occurred: {error}",
                "reason": "InternalError",
                "details": {"causes": [{"message": error}]},
                "code": 500,
            }
        if code == 0:
            return {"metadata": {}, "status": "Success"}
        command = "[" + " ".join(self.argv) + "]"
        return {
            "metadata": {},
            "status": "Failure",
            "message": (
                "command terminated with non-zero exit code: "
                f"error executing command {command}, exit code {code}"
            ),
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
        }


# --- the server ------------------------------------------------------------------------------


def _truthy(value: str | None) -> bool:
    return value in ("true", "1", "True")


def _int_query(request: web.Request, name: str) -> int | None:
    value = request.query.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise bad_request(f'strconv.ParseInt: parsing "{value}": invalid syntax') from None


def _dumps(value) -> str:
    """JSON as Go's encoder writes it: no spaces."""
    return json.dumps(value, separators=(",", ":"))


def _json(body: dict, status: int = 200) -> web.Response:
    return web.Response(body=_dumps(body).encode(), status=status, content_type="application/json")


def _without_type(obj: dict) -> dict:
    """List items carry no kind or apiVersion (the list does)."""
    return {key: value for key, value in obj.items() if key not in ("kind", "apiVersion")}


def _pid_namespace() -> str:
    return os.readlink("/proc/self/ns/pid").removeprefix("pid:[").removesuffix("]")


class FakeKubernetes:
    """The API server and its one node. `start()` serves on 127.0.0.1; `stop()` also
    removes every Docker container and volume it made (the network is the caller's)."""

    def __init__(
        self, *, docker_network: str, version: tuple[int, int] = (1, 33), token: str | None = None
    ):
        self.docker_network = docker_network
        self.version = version
        self.token = token or secrets.token_urlsafe(24)
        # Its PID namespace and process id first: what a killed test run left is known
        # by a dead pid in this namespace.
        self.instance = f"{_pid_namespace()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.url = ""
        self.requests: list[tuple[str, str]] = []
        # What went wrong inside the fake (a kubelet thread, a handler): tests assert none.
        self.errors: list[str] = []
        self.host_ip = "127.0.0.1"
        self.docker_socket = ""
        self.store = _Store()
        self.workers: dict[str, _PodWorker] = {}  # pod uid -> its kubelet
        self.docker = docker.from_env(timeout=120, max_pool_size=64)
        # Its kubelet threads outlive a test's phases, and pytest sets and deletes
        # PYTEST_CURRENT_TEST between them: requests' proxy lookup, which iterates
        # os.environ, then raised KeyError in a kubelet. A unix socket has no proxy.
        self.docker.api.trust_env = False
        self.claims_lock = threading.Lock()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.closing = False
        # The node's kubelet is unreachable: a deletion with a grace period is recorded
        # and never confirmed (only a forced one, grace 0, removes the pod).
        self.node_lost = False
        self.container_root = (0, 0)  # the host ids of a container's root
        self._thread: threading.Thread | None = None
        self._events = None
        self._events_thread: threading.Thread | None = None
        self._background: set = set()

    # --- the public interface --------------------------------------------------------------

    def start(self) -> None:
        host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        if not host.startswith("unix://"):
            raise RuntimeError(f"the fake needs the Docker Engine on a unix socket, not {host}")
        self.docker_socket = host.removeprefix("unix://")
        info = self.docker.info()
        if any(o.startswith("name=userns") for o in info.get("SecurityOptions") or []):
            # userns-remap keeps its store in <root>/<uid>.<gid> of the containers' root
            uid, gid = Path(info["DockerRootDir"]).name.split(".")
            self.container_root = (int(uid), int(gid))
        self._remove_what_dead_runs_left()
        network = self.docker.networks.get(self.docker_network)
        for pool in network.attrs["IPAM"]["Config"] or []:
            if pool.get("Gateway"):
                self.host_ip = pool["Gateway"]
        self._events = self.docker.api.events(
            decode=True, filters={"type": "container", "label": f"{LABEL}={self.instance}"}
        )
        self._events_thread = threading.Thread(
            target=self._follow_docker, name="fake-kubernetes docker events", daemon=True
        )
        self._events_thread.start()
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._serve, args=(ready,), name="fake-kubernetes", daemon=True
        )
        self._thread.start()
        if not ready.wait(30) or not self.url:
            raise RuntimeError("the fake Kubernetes API server did not start")

    def _remove_what_dead_runs_left(self) -> None:
        """Containers and volumes of fakes whose process is gone (a killed test run)."""

        def dead(labels) -> bool:
            namespace, _, rest = (labels or {}).get(LABEL, "").partition("-")
            pid = rest.partition("-")[0]
            if namespace != _pid_namespace() or not pid.isdigit():
                return False  # another machine's or container's run: not ours to judge
            return not Path(f"/proc/{pid}").exists()

        for container in self.docker.containers.list(all=True, filters={"label": LABEL}):
            if dead(container.labels):
                with contextlib.suppress(NotFound):
                    container.remove(force=True)
        for volume in self.docker.volumes.list(filters={"label": LABEL}):
            if dead(volume.attrs.get("Labels")):
                with contextlib.suppress(NotFound, APIError):
                    volume.remove(force=True)

    def stop(self) -> None:
        self.closing = True
        workers = list(self.workers.values())
        for worker in workers:
            worker.inbox.put(("shutdown",))
        for worker in workers:
            worker.thread.join(30)
        if self.loop is not None and self._thread is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(30)
        for container in self.docker.containers.list(
            all=True, filters={"label": f"{LABEL}={self.instance}"}
        ):
            with contextlib.suppress(NotFound):
                container.remove(force=True)
        for volume in self.docker.volumes.list(filters={"label": f"{LABEL}={self.instance}"}):
            with contextlib.suppress(NotFound):
                volume.remove(force=True)
        if self._events is not None:
            with contextlib.suppress(Exception):
                self._events.close()
        if self._events_thread is not None:
            self._events_thread.join(10)
        self.docker.close()

    def write_kubeconfig(self, path) -> str:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": self.token}}],
            "contexts": [
                {
                    "name": "fake",
                    "context": {"cluster": "fake", "user": "fake", "namespace": "default"},
                }
            ],
            "current-context": "fake",
            "preferences": {},
        }
        Path(path).write_text(json.dumps(config, indent=2))
        return str(path)

    def add_service(self, namespace: str, name: str, cluster_ip: str, ports: list[int]) -> None:
        several = len(ports) > 1
        service = {
            "kind": "Service",
            "apiVersion": "v1",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": str(uuid.uuid4()),
                "creationTimestamp": _now(),
            },
            "spec": {
                "clusterIP": cluster_ip,
                "clusterIPs": [cluster_ip],
                "ports": [
                    {
                        **({"name": f"port-{port}"} if several else {}),
                        "protocol": "TCP",
                        "port": port,
                        "targetPort": port,
                    }
                    for port in ports
                ],
                "type": "ClusterIP",
                "sessionAffinity": "None",
                "ipFamilies": ["IPv4"],
                "ipFamilyPolicy": "SingleStack",
                "internalTrafficPolicy": "Cluster",
            },
            "status": {"loadBalancer": {}},
        }
        self.store.create("services", service)

    def evict(self, namespace: str, pod: str) -> None:
        """Returns once the pod is Failed with reason Evicted."""
        found = self.store.get("pods", namespace, pod)
        if found is None:
            raise KeyError(f"no pod {namespace}/{pod}")
        done = threading.Event()
        self.workers[found["metadata"]["uid"]].inbox.put(("evict", done))
        if not done.wait(60):
            raise TimeoutError(f"pod {namespace}/{pod} was not evicted in 60 s")

    def expire_watch_history(self) -> None:
        self.store.expire_history()

    # --- for the kubelets ------------------------------------------------------------------

    def claim_volume(self, claim: dict) -> str:
        meta = claim["metadata"]
        return f"k8s-pvc_{meta['name']}_{meta['namespace']}_{meta['uid'][:8]}"

    def service_links(self, namespace: str) -> list[tuple[str, str, list[int]]]:
        services, _ = self.store.select("services", namespace, lambda _: True)
        return [
            (s["metadata"]["name"], s["spec"]["clusterIP"], [p["port"] for p in s["spec"]["ports"]])
            for s in services
        ]

    def pod_gone(self, worker: _PodWorker, removed: bool) -> None:
        if not removed:
            self.store.delete("pods", worker.namespace, worker.name)
        self.workers.pop(worker.uid, None)
        self.release_claims(worker.namespace)

    def release_claims(self, namespace: str) -> None:
        """The pvc-protection controller: a deleted claim goes once no pod names it."""
        with self.claims_lock:
            claims, _ = self.store.select(
                "persistentvolumeclaims",
                namespace,
                lambda c: bool(c["metadata"].get("deletionTimestamp")),
            )
            if not claims:
                return
            pods, _ = self.store.select("pods", namespace, lambda _: True)
            used = {
                (v.get("persistentVolumeClaim") or {}).get("claimName")
                for pod in pods
                for v in pod["spec"].get("volumes") or []
            }
            for claim in claims:
                name = claim["metadata"]["name"]
                if name in used:
                    continue
                try:
                    self.docker.api.remove_volume(self.claim_volume(claim), force=True)
                except NotFound:
                    pass
                except APIError as exc:  # still mounted by a container on its way out
                    logger.warning("fake Kubernetes: claim %s/%s stays: %s", namespace, name, exc)
                    continue
                self.store.delete("persistentvolumeclaims", namespace, name)

    def bind_claim(self, namespace: str, name: str) -> None:
        """The provisioner and the binder: a Docker volume, then Bound."""
        claim = self.store.get("persistentvolumeclaims", namespace, name)
        if claim is None:
            return
        labels = {LABEL: self.instance, f"{LABEL}.namespace": namespace, f"{LABEL}.claim": name}
        self.docker.volumes.create(self.claim_volume(claim), labels=labels)

        def bound(claim: dict) -> None:
            claim["metadata"].setdefault("annotations", {}).update(
                {
                    "pv.kubernetes.io/bind-completed": "yes",
                    "pv.kubernetes.io/bound-by-controller": "yes",
                    "volume.beta.kubernetes.io/storage-provisioner": "fake.quor.org/docker-volume",
                    "volume.kubernetes.io/storage-provisioner": "fake.quor.org/docker-volume",
                }
            )
            claim["spec"]["volumeName"] = f"pvc-{claim['metadata']['uid']}"
            claim["status"] = {
                "phase": "Bound",
                "accessModes": claim["spec"]["accessModes"],
                "capacity": {"storage": claim["spec"]["resources"]["requests"]["storage"]},
            }

        self.store.update("persistentvolumeclaims", namespace, name, bound)
        for worker in list(self.workers.values()):
            if worker.namespace == namespace:
                worker.inbox.put(("claims",))

    def exec_exit_code(self, exec_id: str) -> int:
        """Once the command has ended (its output may end first), as a kubelet waits."""
        pause = 0.002
        while not self.closing:
            info = self.docker.api.exec_inspect(exec_id)
            if not info["Running"] and info["ExitCode"] is not None:
                return info["ExitCode"]
            time.sleep(pause)
            pause = min(pause * 2, 0.1)
        raise ConnectionError("the fake Kubernetes API server is stopping")

    def _follow_docker(self) -> None:
        """Docker's container events, to the kubelet of the pod they belong to."""
        try:
            for event in self._events:
                if event.get("Action") not in ("start", "die", "destroy", "oom"):
                    continue
                attributes = event.get("Actor", {}).get("Attributes", {})
                worker = self.workers.get(attributes.get(f"{LABEL}.pod-uid", ""))
                if worker is not None:
                    worker.inbox.put(("container", event["Actor"]["ID"]))
        except Exception:
            if not self.closing:
                logger.exception("fake Kubernetes: Docker's event stream ended")

    def _background_call(self, function, *args) -> None:
        future = self.loop.run_in_executor(None, function, *args)
        self._background.add(future)
        future.add_done_callback(self._background_done)

    def _background_done(self, future) -> None:
        self._background.discard(future)
        if not future.cancelled() and future.exception() is not None:
            logger.error("fake Kubernetes: %r", future.exception())
            self.errors.append(repr(future.exception()))

    # --- HTTP ------------------------------------------------------------------------------

    def _serve(self, ready: threading.Event) -> None:
        self.loop = loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        executor = concurrent.futures.ThreadPoolExecutor(64, thread_name_prefix="fake-kubernetes")
        loop.set_default_executor(executor)
        runner = web.AppRunner(
            self._app(), handle_signals=False, access_log=None, shutdown_timeout=2
        )
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(runner.cleanup())
            executor.shutdown(wait=False, cancel_futures=True)
            loop.close()

    def _app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware], client_max_size=64 << 20)
        namespaced = "/api/v1/namespaces/{namespace}"
        app.router.add_get("/version", self._version)
        app.router.add_get("/version/", self._version)
        app.router.add_get("/api", self._api_versions)
        app.router.add_get("/api/", self._api_versions)
        app.router.add_get("/api/v1", self._api_resources)
        app.router.add_get("/api/v1/", self._api_resources)
        app.router.add_get(f"{namespaced}/pods", self._list_pods)
        app.router.add_post(f"{namespaced}/pods", self._create_pod)
        app.router.add_get(f"{namespaced}/pods/{{name}}", self._read_pod)
        app.router.add_delete(f"{namespaced}/pods/{{name}}", self._delete_pod)
        app.router.add_get(f"{namespaced}/pods/{{name}}/exec", self._exec)
        app.router.add_post(f"{namespaced}/pods/{{name}}/exec", self._exec)
        app.router.add_get(f"{namespaced}/pods/{{name}}/log", self._log)
        app.router.add_get(f"{namespaced}/persistentvolumeclaims", self._list_claims)
        app.router.add_post(f"{namespaced}/persistentvolumeclaims", self._create_claim)
        app.router.add_get(f"{namespaced}/persistentvolumeclaims/{{name}}", self._read_claim)
        app.router.add_delete(f"{namespaced}/persistentvolumeclaims/{{name}}", self._delete_claim)
        app.router.add_post(f"{namespaced}/secrets", self._create_secret)
        app.router.add_get(f"{namespaced}/secrets/{{name}}", self._read_secret)
        app.router.add_delete(f"{namespaced}/secrets/{{name}}", self._delete_secret)
        app.router.add_get(f"{namespaced}/services/{{name}}", self._read_service)
        return app

    @web.middleware
    async def _middleware(self, request: web.Request, handler):
        self.requests.append((request.method, request.path))
        try:
            if request.headers.get("Authorization") != f"Bearer {self.token}":
                raise ApiError(401, "Unauthorized", "Unauthorized")
            if request.query.get("dryRun"):
                raise bad_request(f"dryRun is {NOT_MODELLED}")
            return await handler(request)
        except ApiError as error:
            return _json(error.status(), error.code)
        except web.HTTPMethodNotAllowed:
            message = "the server does not allow this method on the requested resource"
            return _json(ApiError(405, "MethodNotAllowed", message, {}).status(), 405)
        except web.HTTPNotFound:
            message = "the server could not find the requested resource"
            return _json(ApiError(404, "NotFound", message, {}).status(), 404)
        except web.HTTPException as exc:
            return _json(
                ApiError(exc.status, exc.reason, exc.text or exc.reason).status(), exc.status
            )
        except Exception as exc:
            logger.exception("fake Kubernetes: %s %s", request.method, request.path)
            self.errors.append(f"{request.method} {request.path}: {exc!r}")
            error = f"{exc!r}"
            internal = ApiError(
                500,
                "InternalError",
                f"Internal error occurred: {error}",
                {"causes": [{"message": error}]},
            )
            return _json(internal.status(), 500)

    async def _version(self, request: web.Request) -> web.Response:
        major, minor = self.version
        return _json(
            {
                "major": str(major),
                "minor": str(minor),
                "emulationMajor": str(major),
                "emulationMinor": str(minor),
                "minCompatibilityMajor": str(major),
                "minCompatibilityMinor": str(minor - 1),
                "gitVersion": f"v{major}.{minor}.0",
                "gitCommit": "0" * 40,
                "gitTreeState": "clean",
                "buildDate": "2026-01-01T00:00:00Z",
                "goVersion": "go1.24.0",
                "compiler": "gc",
                "platform": "linux/amd64",
            }
        )

    async def _api_versions(self, request: web.Request) -> web.Response:
        return _json(
            {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [
                    {"clientCIDR": "0.0.0.0/0", "serverAddress": self.url.removeprefix("http://")}
                ],
            }
        )

    async def _api_resources(self, request: web.Request) -> web.Response:
        def resource(name, kind, verbs, namespaced=True):
            return {
                "name": name,
                "singularName": "",
                "namespaced": namespaced,
                "kind": kind,
                "verbs": verbs,
            }

        return _json(
            {
                "kind": "APIResourceList",
                "groupVersion": "v1",
                "resources": [
                    resource("pods", "Pod", ["create", "delete", "get", "list", "watch"]),
                    resource("pods/exec", "PodExecOptions", ["create", "get"]),
                    resource("pods/log", "Pod", ["get"]),
                    resource(
                        "persistentvolumeclaims",
                        "PersistentVolumeClaim",
                        ["create", "delete", "get", "list"],
                    ),
                    resource("services", "Service", ["get"]),
                ],
            }
        )

    # pods

    async def _create_pod(self, request: web.Request) -> web.Response:
        namespace = request.match_info["namespace"]
        pod = new_pod(_decode(await request.read(), "Pod"), namespace)
        pod = self.store.create("pods", pod)
        worker = _PodWorker(self, pod)
        self.workers[worker.uid] = worker
        worker.thread.start()
        return _json(pod, 201)

    async def _read_pod(self, request: web.Request) -> web.Response:
        return _json(self._pod(request))

    def _pod(self, request: web.Request) -> dict:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        pod = self.store.get("pods", namespace, name)
        if pod is None:
            raise not_found("pods", name)
        return pod

    async def _list_pods(self, request: web.Request) -> web.StreamResponse:
        return await self._list(request, "pods", "PodList")

    async def _delete_pod(self, request: web.Request) -> web.Response:
        pod = self._pod(request)
        raw = await request.read()
        try:
            options = json.loads(raw) if raw.strip() else {}
        except ValueError as exc:
            raise bad_request(f"json parse error: {exc}") from None
        grace = options.get("gracePeriodSeconds")
        if grace is None and request.query.get("gracePeriodSeconds") is not None:
            grace = _int_query(request, "gracePeriodSeconds")
        if grace is None:
            grace = pod["spec"]["terminationGracePeriodSeconds"]
        meta = pod["metadata"]
        worker = self.workers.get(meta["uid"])
        if meta.get("deletionTimestamp") and grace != 0:
            return _json(pod)
        if grace == 0:  # immediately, as a forced delete: the kubelet cleans up afterwards
            deleted = self.store.delete("pods", meta["namespace"], meta["name"])
            if worker is not None:
                worker.inbox.put(("delete", 0, True))
            return _json(deleted)

        def terminating(pod: dict) -> None:
            pod["metadata"]["deletionTimestamp"] = (
                datetime.now(UTC) + timedelta(seconds=grace)
            ).strftime("%Y-%m-%dT%H:%M:%SZ")
            pod["metadata"]["deletionGracePeriodSeconds"] = grace

        pod = self.store.update("pods", meta["namespace"], meta["name"], terminating)
        if worker is not None and not self.node_lost:
            worker.inbox.put(("delete", grace, False))
        return _json(pod)

    async def _log(self, request: web.Request) -> web.Response:
        pod = self._pod(request)
        container = self._container_of(pod, request.query.get("container"))
        name = pod["metadata"]["name"]
        for option in ("follow", "sinceSeconds", "sinceTime"):
            if request.query.get(option) and request.query[option] != "false":
                raise bad_request(f"{option} is {NOT_MODELLED}")
        if _truthy(request.query.get("previous")):
            raise bad_request(
                f'previous terminated container "{container}" in pod "{name}" not found'
            )
        worker = self.workers.get(pod["metadata"]["uid"])
        container_id = worker.container_id(container) if worker else ""
        if not container_id:
            statuses = (pod["status"].get("initContainerStatuses") or []) + (
                pod["status"].get("containerStatuses") or []
            )
            waiting = next(
                (s["state"].get("waiting", {}) for s in statuses if s["name"] == container), {}
            )
            reason = waiting.get("reason", "ContainerCreating")
            raise bad_request(
                f'container "{container}" in pod "{name}" is waiting to start: {reason}'
            )
        tail = _int_query(request, "tailLines")
        logs = await asyncio.get_running_loop().run_in_executor(
            None,
            lambda: self.docker.api.logs(
                container_id,
                stdout=True,
                stderr=True,
                tail=tail if tail is not None else "all",
                timestamps=_truthy(request.query.get("timestamps")),
            ),
        )
        limit = _int_query(request, "limitBytes")
        if limit is not None:
            logs = logs[:limit]
        return web.Response(body=logs, content_type="text/plain", charset="utf-8")

    def _container_of(self, pod: dict, container: str | None) -> str:
        spec, name = pod["spec"], pod["metadata"]["name"]
        apps = [c["name"] for c in spec["containers"]]
        inits = [c["name"] for c in spec.get("initContainers") or []]
        if not container:
            if len(apps) == 1:
                return apps[0]
            message = (
                f"a container name must be specified for pod {name}, "
                f"choose one of: [{' '.join(apps)}]"
            )
            if inits:
                message += f" or one of the init containers: [{' '.join(inits)}]"
            raise bad_request(message)
        if container not in apps + inits:
            raise bad_request(f"container {container} is not valid for pod {name}")
        return container

    async def _exec(self, request: web.Request) -> web.StreamResponse:
        pod = self._pod(request)
        argv = request.query.getall("command", [])
        if not argv:
            raise bad_request("you must specify at least one command for the container")
        stdin, stdout, stderr, tty = (
            _truthy(request.query.get(k)) for k in ("stdin", "stdout", "stderr", "tty")
        )
        if not (stdin or stdout or stderr):
            raise bad_request("you must specify at least 1 of stdin, stdout, stderr")
        container = self._container_of(pod, request.query.get("container"))
        phase = pod["status"].get("phase")
        if phase in ("Succeeded", "Failed"):
            raise bad_request(
                f"cannot exec into a container in a completed pod; current phase is {phase}"
            )
        worker = self.workers.get(pod["metadata"]["uid"])
        container_id = worker.container_id(container) if worker else ""
        loop = asyncio.get_running_loop()
        if not container_id or not await loop.run_in_executor(None, worker._running, container_id):
            raise bad_request(f'unable to upgrade connection: container not found ("{container}")')
        # v5 (stdin close) is on by default from Kubernetes 1.30.
        protocols = CHANNEL_PROTOCOLS if self.version >= (1, 30) else CHANNEL_PROTOCOLS[1:]
        ws = web.WebSocketResponse(protocols=protocols, max_msg_size=0, compress=False, timeout=5)
        handshake = ws.can_prepare(request)
        if not handshake.ok:
            raise bad_request("Upgrade request required")
        if handshake.protocol is None:
            raise bad_request(
                "unable to upgrade connection: none of the requested subprotocols is supported: "
                + ", ".join(protocols)
            )
        await ws.prepare(request)

        def create() -> str:
            return self.docker.api.exec_create(
                container_id, argv, stdin=stdin, stdout=stdout, stderr=stderr, tty=tty
            )["Id"]

        try:
            exec_id = await loop.run_in_executor(None, create)
            stream = await self._start_exec(exec_id, tty)
        except (DockerException, OSError) as exc:
            error = f"error executing command in container: {exc}"
            status = ApiError(
                500,
                "InternalError",
                f"Internal error occurred: {error}",
                {"causes": [{"message": error}]},
            ).status()
            del status["kind"], status["apiVersion"]
            await ws.send_bytes(bytes([STATUS]) + _dumps(status).encode())
            await ws.close()
            return ws
        await _ExecSession(self, ws, stream, exec_id, argv, tty).run()
        return ws

    async def _start_exec(self, exec_id: str, tty: bool):
        """Starts a docker exec on a connection of the fake's own, upgraded to the raw
        stream: (reader, writer). (docker-py's hijacked socket can lose the stream's first
        bytes to its HTTP reader, and closes when its response is collected.)"""
        reader, writer = await asyncio.open_unix_connection(self.docker_socket)
        body = _dumps({"Detach": False, "Tty": tty}).encode()
        writer.write(
            f"POST /v{self.docker.api.api_version}/exec/{exec_id}/start HTTP/1.1\r\n"
            "Host: docker\r\nContent-Type: application/json\r\n"
            f"Connection: Upgrade\r\nUpgrade: tcp\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        if head.split(b" ", 2)[1:2] != [b"101"]:
            writer.close()
            raise DockerException(head.split(b"\r\n", 1)[0].decode(errors="replace"))
        return reader, writer

    # persistent volume claims

    async def _create_claim(self, request: web.Request) -> web.Response:
        namespace = request.match_info["namespace"]
        claim = new_claim(_decode(await request.read(), "PersistentVolumeClaim"), namespace)
        claim = self.store.create("persistentvolumeclaims", claim)
        self._background_call(self.bind_claim, namespace, claim["metadata"]["name"])
        return _json(claim, 201)

    def _claim(self, request: web.Request) -> dict:
        return self._stored(request, "persistentvolumeclaims")

    def _stored(self, request: web.Request, resource: str) -> dict:
        """The object of `resource` the request's path names; 404 when there is none."""
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        found = self.store.get(resource, namespace, name)
        if found is None:
            raise not_found(resource, name)
        return found

    async def _read_claim(self, request: web.Request) -> web.Response:
        return _json(self._claim(request))

    async def _list_claims(self, request: web.Request) -> web.StreamResponse:
        return await self._list(request, "persistentvolumeclaims", "PersistentVolumeClaimList")

    async def _delete_claim(self, request: web.Request) -> web.Response:
        claim = self._claim(request)
        meta = claim["metadata"]
        if not meta.get("deletionTimestamp"):

            def terminating(claim: dict) -> None:
                claim["metadata"]["deletionTimestamp"] = _now()
                claim["metadata"]["deletionGracePeriodSeconds"] = 0

            claim = self.store.update(
                "persistentvolumeclaims", meta["namespace"], meta["name"], terminating
            )
        self._background_call(self.release_claims, meta["namespace"])
        return _json(claim)

    # secrets

    async def _create_secret(self, request: web.Request) -> web.Response:
        namespace = request.match_info["namespace"]
        secret = new_secret(_decode(await request.read(), "Secret"), namespace)
        return _json(self.store.create("secrets", secret), 201)

    async def _read_secret(self, request: web.Request) -> web.Response:
        return _json(self._stored(request, "secrets"))

    async def _delete_secret(self, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        secret = self.store.delete("secrets", namespace, name)
        if secret is None:
            raise not_found("secrets", name)
        details = {"name": name, "kind": "secrets", "uid": secret["metadata"]["uid"]}
        return _json(
            {"kind": "Status", "apiVersion": "v1", "status": "Success", "details": details}
        )

    # services

    async def _read_service(self, request: web.Request) -> web.Response:
        return _json(self._stored(request, "services"))

    # lists and watches

    async def _list(
        self, request: web.Request, resource: str, list_kind: str
    ) -> web.StreamResponse:
        namespace = request.match_info["namespace"]
        query = request.query
        if query.get("sendInitialEvents"):
            raise bad_request(f"sendInitialEvents is {NOT_MODELLED}")
        by_labels = (
            parse_label_selector(query["labelSelector"]) if query.get("labelSelector") else None
        )
        by_fields = (
            parse_field_selector(resource, query["fieldSelector"])
            if query.get("fieldSelector")
            else None
        )

        def accepts(obj: dict) -> bool:
            labels = obj["metadata"].get("labels") or {}
            return (by_labels is None or by_labels(labels)) and (
                by_fields is None or by_fields(obj)
            )

        if _truthy(query.get("watch")):
            return await self._watch(request, resource, namespace, accepts)
        items, revision = self.store.select(resource, namespace, accepts)
        metadata: dict = {"resourceVersion": str(revision)}
        if query.get("continue"):
            try:
                token = json.loads(base64.urlsafe_b64decode(query["continue"]))
                revision, after = token["rv"], token["start"]
            except (ValueError, KeyError, TypeError):
                raise bad_request(
                    "continue key is not valid: incorrect encoded start resourceVersion "
                    "(version meta.k8s.io/v1)"
                ) from None
            items = [i for i in items if i["metadata"]["name"] > after]
            metadata["resourceVersion"] = str(revision)
        limit = _int_query(request, "limit") or 0
        if limit and len(items) > limit:
            rest = len(items) - limit
            items = items[:limit]
            token = {"rv": int(metadata["resourceVersion"]), "start": items[-1]["metadata"]["name"]}
            metadata["continue"] = base64.urlsafe_b64encode(json.dumps(token).encode()).decode()
            metadata["remainingItemCount"] = rest
        return _json(
            {
                "kind": list_kind,
                "apiVersion": "v1",
                "metadata": metadata,
                "items": [_without_type(i) for i in items],
            }
        )

    async def _watch(
        self, request: web.Request, resource: str, namespace: str, accepts
    ) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        timeout = _int_query(request, "timeoutSeconds") or DEFAULT_WATCH_TIMEOUT_S
        watcher = _Watcher(loop, resource, namespace, accepts)
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        try:
            initial = self.store.watch(watcher, request.query.get("resourceVersion", ""))
        except ApiError as error:
            if error.code != 410:
                raise
            await response.prepare(request)
            await response.write(
                _dumps({"type": "ERROR", "object": error.status()}).encode() + b"\n"
            )
            await response.write_eof()
            return response
        try:
            await response.prepare(request)
            for event in initial:
                await self._write_event(response, event)
            deadline = loop.time() + timeout
            while not self.closing and (remaining := deadline - loop.time()) > 0:
                try:
                    event = await asyncio.wait_for(watcher.queue.get(), min(remaining, 1))
                except TimeoutError:
                    if request.transport is None or request.transport.is_closing():
                        break
                    continue
                await self._write_event(response, event)
            await response.write_eof()
        except (ConnectionError, RuntimeError):
            pass
        finally:
            self.store.unwatch(watcher)
        return response

    async def _write_event(self, response: web.StreamResponse, event: tuple[str, dict]) -> None:
        kind, obj = event
        await response.write(_dumps({"type": kind, "object": obj}).encode() + b"\n")
