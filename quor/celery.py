import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "quor.settings")

app = Celery("quor")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()  # <app>/tasks.py of every installed app
# The sandboxes app's tasks live with the layer they belong to (docs/architecture.md).
app.autodiscover_tasks(["sandboxes.runtime", "sandboxes.sessions", "sandboxes.scheduling"])
