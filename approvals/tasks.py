from celery import shared_task

from approvals import services


@shared_task
def expire_stale_approvals() -> int:
    """Requests left pending past their expiry by a proxy that went away."""
    return services.approvals_expire_stale()
