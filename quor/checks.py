"""System checks that stop start-up on configuration that would be unsafe.

quor.E001-E003 checked the first operator and worker tokens, removed because no endpoint
used them; their ids are not reused, so an id keeps meaning one thing (the operator
token's checks are E011 and E012)."""

import ipaddress

from django.conf import settings
from django.core.checks import Error, Warning, register

from sandboxes.backends import get_backend
from sandboxes.backends.base import BackendError, BackendUnavailable


@register()
def check_encryption_key(app_configs, **kwargs):
    if settings.DEBUG or settings.QUOR_ENCRYPTION_KEY:
        return []
    return [
        Error(
            "QUOR_ENCRYPTION_KEY is not set.",
            hint="Outside development, stored credentials need their own key. Set "
            "QUOR_ENCRYPTION_KEY (or QUOR_ENCRYPTION_KEY_FILE) and keep it: losing it "
            "makes stored credentials unreadable.",
            id="quor.E004",
        )
    ]


@register()
def check_approval_timeout(app_configs, **kwargs):
    """proxy.py drops a connection that was silent longer than its idle timeout as soon
    as a parked request's hook returns: an approval would then arrive for nobody."""
    if settings.QUOR_EGRESS_IDLE_TIMEOUT > settings.QUOR_APPROVAL_TIMEOUT_SECONDS:
        return []
    return [
        Error(
            "QUOR_APPROVAL_TIMEOUT_SECONDS must be shorter than QUOR_EGRESS_IDLE_TIMEOUT.",
            hint="A request parked for approval keeps its proxied connection silent.",
            id="quor.E005",
        )
    ]


@register()
def check_sandbox_backend(app_configs, **kwargs):
    """The memory backend runs sandbox commands as processes of this host."""
    if settings.QUOR_SANDBOX_BACKEND != "memory" or settings.DEBUG:
        return []
    return [
        Error(
            "QUOR_SANDBOX_BACKEND=memory is for tests only.",
            hint="The memory backend runs sandbox commands as processes of this host and "
            "isolates nothing: use docker.",
            id="quor.E006",
        )
    ]


@register()
def check_kubernetes_backend(app_configs, **kwargs):
    """The Kubernetes backend's settings, and its server's version: a server too old for
    the exec protocol Quor needs is refused at start-up rather than at the first command."""
    if settings.QUOR_SANDBOX_BACKEND != "kubernetes":
        return []
    errors = []
    try:
        network = ipaddress.IPv4Network(settings.QUOR_KUBERNETES_CONTROL_PLANE_CIDR)
    except ValueError:
        network = None
    if network is None or network.prefixlen < 8:
        errors.append(
            Error(
                "QUOR_KUBERNETES_CONTROL_PLANE_CIDR must be an IPv4 CIDR with a prefix of 8 to 32.",
                hint="The cluster's pod network, e.g. 10.244.0.0/16: sandboxes accept "
                "connections only from there (the web app proxy, workers moving workspaces).",
                id="quor.E007",
            )
        )
    namespace, _, name = settings.QUOR_KUBERNETES_EGRESS_SERVICE.partition("/")
    if not namespace or not name:
        errors.append(
            Error(
                "QUOR_KUBERNETES_EGRESS_SERVICE must be <namespace>/<name>.",
                hint="The egress proxy's Service, e.g. quor/quor-egress-proxy.",
                id="quor.E008",
            )
        )
    try:
        get_backend("kubernetes").check_version()
    except BackendUnavailable as exc:
        errors.append(Warning(str(exc), id="quor.W001"))
    except BackendError as exc:
        errors.append(Error(str(exc), id="quor.E009"))
    return errors


@register()
def check_docker_host_users(app_configs, **kwargs):
    """A sandbox's users must map to host ids that no account owns. Processes without
    the Docker socket (migrate, the web app proxy) pass: the backend checks again before
    it creates each sandbox."""
    if settings.QUOR_SANDBOX_BACKEND != "docker":
        return []
    try:
        get_backend("docker").check_host_users()
    except BackendUnavailable:
        return []
    except BackendError as exc:
        return [Error(str(exc), id="quor.E010")]
    return []


OPERATOR_TOKEN_MIN_LENGTH = 32


@register()
def check_operator_tokens(app_configs, **kwargs):
    from quor.lib.authentication import previous_operator_token_until

    errors = []
    current = settings.QUOR_OPERATOR_TOKEN
    previous = settings.QUOR_OPERATOR_TOKEN_PREVIOUS
    for name, value in [
        ("QUOR_OPERATOR_TOKEN", current),
        ("QUOR_OPERATOR_TOKEN_PREVIOUS", previous),
    ]:
        if value and len(value) < OPERATOR_TOKEN_MIN_LENGTH:
            errors.append(
                Error(
                    f"{name} is shorter than {OPERATOR_TOKEN_MIN_LENGTH} characters.",
                    hint="Generate one: python -c 'import secrets; "
                    "print(secrets.token_urlsafe(32))'",
                    id="quor.E011",
                )
            )
    if previous and (not current or previous == current):
        errors.append(
            Error(
                "QUOR_OPERATOR_TOKEN_PREVIOUS is set without a different QUOR_OPERATOR_TOKEN.",
                hint="The previous token is the old value of a rotation: set the new one "
                "as QUOR_OPERATOR_TOKEN.",
                id="quor.E012",
            )
        )
    if previous:
        try:
            previous_operator_token_until()
        except ValueError as exc:
            errors.append(Error(str(exc), id="quor.E012"))
    return errors
