"""Scheduled tasks: prompts Celery beat starts as new sessions on a cron schedule.
Built on sandboxes.sessions."""
