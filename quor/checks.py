"""System checks that stop start-up on configuration that would be unsafe.

quor.E001-E003 checked the operator and worker tokens, removed because no endpoint
used them; their ids are not reused, so an id keeps meaning one thing."""

from django.conf import settings
from django.core.checks import Error, register


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
