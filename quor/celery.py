import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "quor.settings")

app = Celery("quor")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
