from celery import shared_task

from webapps import tunnels


@shared_task(name="webapps.tasks.close_lost_tunnels")
def close_lost_tunnels() -> int:
    """Beat, every 30 s: tunnels past their TTL, or whose web process died without a
    word (their heartbeat is gone), are closed (their routes are gone already); the
    rows of tunnels closed long ago are deleted."""
    tunnels.tunnels_delete_closed()
    return tunnels.tunnels_close_lost()
