"""System checks that stop start-up on configuration that would be unsafe."""

from django.conf import settings
from django.core.checks import Error, register

MIN_TOKEN_LENGTH = 32


@register()
def check_static_tokens(app_configs, **kwargs):
    errors = []
    tokens = {
        "QUOR_OPERATOR_TOKEN": settings.QUOR_OPERATOR_TOKEN,
        "QUOR_WORKER_TOKEN": settings.QUOR_WORKER_TOKEN,
    }
    for number, (name, value) in enumerate(tokens.items(), start=1):
        if value and len(value) < MIN_TOKEN_LENGTH:
            errors.append(
                Error(
                    f"{name} is set but shorter than {MIN_TOKEN_LENGTH} characters.",
                    hint="Generate one with: openssl rand -base64 33",
                    id=f"quor.E00{number}",
                )
            )
    if settings.QUOR_OPERATOR_TOKEN and settings.QUOR_OPERATOR_TOKEN == settings.QUOR_WORKER_TOKEN:
        errors.append(
            Error(
                "QUOR_OPERATOR_TOKEN and QUOR_WORKER_TOKEN have the same value.",
                hint="Operators and workers must hold different tokens.",
                id="quor.E003",
            )
        )
    return errors


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
