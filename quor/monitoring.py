"""Gauges counted in PostgreSQL at each scrape: sandboxes by state and network policy,
agent turns pending and running, approvals waiting. Only the web process serves them
(quor/asgi.py): every process would report the same numbers. With several web replicas,
aggregate them with max(), not sum() (docs/monitoring.md)."""

import collections
import logging

from django.db import DatabaseError, connection
from django.db.models import Count
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from approvals.models import ApprovalRequest
from sandboxes.models import Sandbox, Session

logger = logging.getLogger(__name__)

OPEN_TURNS = (Session.Status.PENDING, Session.Status.RUNNING)


class DatabaseGauges(Collector):
    def describe(self):
        return _families()  # without values: registering must not query the database

    def collect(self):
        sandboxes, turns, approvals = _families()
        try:
            by_state = collections.Counter(
                {
                    (row["state"], row["network_policy"]): row["n"]
                    for row in Sandbox.objects.order_by()
                    .values("state", "network_policy")
                    .annotate(n=Count("pk"))
                }
            )
            by_status = dict(
                Session.objects.filter(status__in=OPEN_TURNS)
                .order_by()
                .values_list("status")
                .annotate(n=Count("pk"))
            )
            waiting = ApprovalRequest.objects.filter(status=ApprovalRequest.Status.PENDING).count()
        except DatabaseError as exc:  # the scrape still serves the other metrics
            logger.warning("metrics: no database gauges this time: %s", exc)
            return []
        finally:
            connection.close()  # each scrape runs in a new thread: leave no connection open
        for state in Sandbox.State.values:
            for policy in Sandbox.NetworkPolicy.values:
                sandboxes.add_metric([state, policy], by_state[state, policy])
        for status in OPEN_TURNS:
            turns.add_metric([status], by_status.get(status, 0))
        approvals.add_metric([], waiting)
        return [sandboxes, turns, approvals]


def _families() -> list[GaugeMetricFamily]:
    return [
        GaugeMetricFamily(
            "quor_sandboxes",
            "Sandboxes by state and network policy.",
            labels=["state", "network_policy"],
        ),
        GaugeMetricFamily(
            "quor_agent_turns",
            "Agent turns queued to start (pending) and running.",
            labels=["status"],
        ),
        GaugeMetricFamily(
            "quor_approvals_waiting", "Parked requests waiting for the session owner's decision."
        ),
    ]
