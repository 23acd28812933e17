import os

from celery import Celery, signals
from django.conf import settings

from quor.lib import logs, metrics

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "quor.settings")

app = Celery("quor")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()  # <app>/tasks.py of every installed app
# The sandboxes app's tasks live with the layer they belong to (docs/architecture.md).
app.autodiscover_tasks(
    ["sandboxes.runtime", "sandboxes.sessions", "sandboxes.scheduling", "sandboxes.terminal"]
)


# --- metrics and logs of workers and beat (docs/monitoring.md) ---------------------------


@signals.celeryd_init.connect
def serve_worker_metrics(**kwargs):
    """The pool's children run the tasks and record into files; the worker's main
    process serves their sum. Sent before the pool forks."""
    if settings.QUOR_METRICS_PORT:
        metrics.serve_multiprocess(settings.QUOR_METRICS_PORT)


@signals.worker_process_shutdown.connect
def forget_pool_child(pid=None, **kwargs):
    metrics.forget_process(pid)


@signals.beat_init.connect
def serve_beat_metrics(**kwargs):
    if settings.QUOR_METRICS_PORT:
        metrics.serve(settings.QUOR_METRICS_PORT)


@signals.before_task_publish.connect
def pass_on_the_request_id(headers=None, **kwargs):
    """A task enqueued while serving a request logs that request's id too."""
    if headers is not None and (current := logs.request_id.get()):
        headers["quor_request_id"] = current


@signals.task_prerun.connect
def log_with_task_id(task_id=None, task=None, **kwargs):
    logs.task_id.set(task_id or "")
    enqueued_by = getattr(task.request, "quor_request_id", None) if task else None
    logs.request_id.set(enqueued_by or "")


@signals.task_postrun.connect
def count_task(task=None, state=None, **kwargs):
    metrics.CELERY_TASKS.labels(task.name, (state or "unknown").lower()).inc()
    logs.task_id.set("")
    logs.request_id.set("")
