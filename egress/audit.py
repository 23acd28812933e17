"""Records egress decisions without slowing requests: a queue drained into
PostgreSQL by one background thread per proxy process, in batches."""

import logging
import queue
import threading
from urllib.parse import parse_qsl, urlencode

from django.db import close_old_connections
from django.utils import timezone

from egress.models import EgressDecision

logger = logging.getLogger(__name__)


def mask_path(target: str) -> str:
    """The path with every query value masked: query strings often carry secrets."""
    path, sep, query = target.partition("?")
    if not sep:
        return path
    masked = [(name, "***") for name, _ in parse_qsl(query, keep_blank_values=True)]
    return f"{path}?{urlencode(masked, safe='*')}"


class AuditLog:
    def __init__(self, flush_seconds: float = 0.5):
        self.flush_seconds = flush_seconds
        self._queue: queue.Queue = queue.Queue(maxsize=100_000)

    def start(self) -> None:
        threading.Thread(target=self._run, name="egress-audit", daemon=True).start()

    def record(self, **fields) -> None:
        fields["created_at"] = timezone.now()
        fields["path"] = mask_path(fields.get("path", ""))
        try:
            self._queue.put_nowait(EgressDecision(**fields))
        except queue.Full:
            logger.error("egress audit queue full; a decision was not recorded")

    def _run(self) -> None:
        while True:
            batch = [self._queue.get()]
            while len(batch) < 500:
                try:
                    batch.append(self._queue.get(timeout=self.flush_seconds))
                except queue.Empty:
                    break
            try:
                close_old_connections()
                EgressDecision.objects.bulk_create(batch)
            except Exception:  # the proxy keeps serving; the loss is logged
                logger.exception("could not record %d egress decisions", len(batch))
