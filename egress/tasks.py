from celery import shared_task

from egress import services


@shared_task
def delete_old_egress_decisions() -> None:
    services.egress_decisions_delete_old()
