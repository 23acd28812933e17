"""Quor's Prometheus metrics: every definition, the one-line helpers the services call,
and how each process serves them on QUOR_METRICS_PORT (docs/monitoring.md lists every
metric with its meaning, and the alerts worth having). The gauges counted in PostgreSQL
are quor/monitoring.py's, served by the web process only.

Labels are few and bounded: an operation, an outcome, a state, a stable code. Never a
user, sandbox or session id, a URL, a host or a secret.

Every metric here has labels, so that its values are made when it is first used, not
when this module is imported. Processes that fork workers which record metrics (Celery's
prefork pool, the egress proxy's acceptors) import this module while Django starts, and
only then switch to prometheus_client's multi-process mode (`serve_multiprocess`), before
they fork. tests/quor/test_metrics.py checks that every metric has labels.
"""

import atexit
import collections
import functools
import logging
import os
import re
import shutil
import tempfile
import time

from django.conf import settings
from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    multiprocess,
    start_http_server,
    values,
)

logger = logging.getLogger(__name__)

# No `_created` series beside each counter and histogram: Prometheus needs none of them.
disable_created_metrics()

# --- sandboxes ------------------------------------------------------------------------

SANDBOX_OPERATION_SECONDS = Histogram(
    "quor_sandbox_operation_duration_seconds",
    "Sandbox starts (a new runtime), wakes (a new runtime with the newest good snapshot "
    "restored) and sleeps (snapshot written, then the runtime removed), by outcome.",
    ["operation", "outcome"],
    buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600),
)
SANDBOX_RUNTIMES_LOST = Counter(
    "quor_sandbox_runtimes_lost_total",
    "Runtimes found stopped or gone behind Quor's back (a node or host lost, an eviction, "
    "a container removed by hand), by the state the sandbox was then recorded in.",
    ["recorded_as"],
)
SNAPSHOT_SIZE_BYTES = Histogram(
    "quor_snapshot_size_bytes",
    "Compressed size of each snapshot written to the file store, by sandbox backend.",
    ["backend"],
    buckets=tuple(2**n for n in range(16, 37, 2)),  # 64 KiB, 256 KiB, ... 64 GiB
)

# --- sessions and agent turns -----------------------------------------------------------

TURN_SECONDS = Histogram(
    "quor_agent_turn_duration_seconds",
    "Agent turns from their start to their end, by how they ended (finished: the agent "
    "ended it; failed; cancelled by the user).",
    ["outcome"],
    buckets=(5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200),
)
TURN_FAILURES = Counter(
    "quor_agent_turn_failures_total",
    "Turns Quor ended as failed, by error code (agent.lost, agent.timeout, agent.crashed, "
    "agent.sandbox_unavailable, ...). An agent's own error event is not counted here.",
    ["code"],
)
EVENTS_INGESTED = Counter(
    "quor_session_events_ingested_total",
    "Events reported by agents and stored, by kind.",
    ["kind"],
)

# --- egress and approvals ---------------------------------------------------------------

EGRESS_DECISIONS = Counter(
    "quor_egress_decisions_total",
    "Decisions of the egress proxy, by outcome (tunneled, forwarded, injected, blocked), "
    "refusal code (empty unless blocked) and the sandbox's network policy (unknown when "
    "the client is no sandbox).",
    ["outcome", "code", "network_policy"],
)
APPROVAL_WAIT_SECONDS = Histogram(
    "quor_approval_wait_seconds",
    "How long parked requests waited for a decision, by the decision (approved, rejected, "
    "expired).",
    ["status"],
    buckets=(1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600),
)

# --- web apps, the API, Celery ----------------------------------------------------------

WEBAPP_PROXY_REQUESTS = Counter(
    "quor_webapp_proxy_requests_total",
    "Requests the web app proxy answered, by status class (2xx ... 5xx; 1xx is a "
    "WebSocket upgrade).",
    ["status_class"],
)
API_ERRORS = Counter(
    "quor_api_errors_total",
    "API error responses, by error code (docs/errors.md).",
    ["code"],
)
CELERY_TASKS = Counter(
    "quor_celery_tasks_total",
    "Celery tasks that ran, by task name and final state (success, failure, retry, ...).",
    ["task", "state"],
)

# --- what the services call ---------------------------------------------------------------


def sandbox_operation(operation: str):
    """Decorates one sandbox lifecycle step: its duration, `ok` when it returns and
    `failed` when it raises."""

    def decorate(function):
        @functools.wraps(function)
        def timed(*args, **kwargs):
            started, outcome = time.monotonic(), "failed"
            try:
                result = function(*args, **kwargs)
                outcome = "ok"
                return result
            finally:
                SANDBOX_OPERATION_SECONDS.labels(operation, outcome).observe(
                    time.monotonic() - started
                )

        return timed

    return decorate


TURN_OUTCOMES = {"waiting": "finished", "failed": "failed", "cancelled": "cancelled"}


def turn_ended(status: str, started_at) -> None:
    """A turn ended with the session in `status`; `started_at` is its start (None: the
    turn never started)."""
    if started_at is not None:
        seconds = time.time() - started_at.timestamp()
        TURN_SECONDS.labels(TURN_OUTCOMES.get(status, status)).observe(max(seconds, 0))


def events_ingested(kinds) -> None:
    for kind, count in collections.Counter(kinds).items():
        EVENTS_INGESTED.labels(kind).inc(count)


def egress_decided(*, outcome: str, code: str, network_policy: str) -> None:
    EGRESS_DECISIONS.labels(outcome, bounded_code(code) if code else "", network_policy).inc()


def approval_decided(*, status: str, created_at, decided_at) -> None:
    APPROVAL_WAIT_SECONDS.labels(status).observe(max((decided_at - created_at).total_seconds(), 0))


def webapp_request(status: int) -> None:
    WEBAPP_PROXY_REQUESTS.labels(f"{status // 100}xx").inc()


def api_error(code: str) -> None:
    API_ERRORS.labels(bounded_code(code)).inc()


CODE_SHAPE = re.compile(r"[a-z][a-z0-9_]{0,40}(\.[a-z][a-z0-9_]{0,40})?")
MAX_CODES = 200
_codes_seen: set[str] = set()


def bounded_code(code: str) -> str:
    """A stable error code as a label value. Some codes come from the file helper that
    runs inside a sandbox, whose user could make it answer anything: a code of another
    shape, or one past the first MAX_CODES seen, counts as `other`."""
    if not CODE_SHAPE.fullmatch(code):
        return "other"
    if code not in _codes_seen:
        if len(_codes_seen) >= MAX_CODES:
            return "other"
        _codes_seen.add(code)
    return code


# --- serving ----------------------------------------------------------------------------


def serve(port: int, *, collectors=()) -> None:
    """Serves this process's metrics, and those of `collectors`, at
    http://QUOR_METRICS_ADDRESS:`port`/metrics from a thread of its own. For processes
    that do not fork."""
    for collector in collectors:
        REGISTRY.register(collector)
    start_http_server(port, addr=settings.QUOR_METRICS_ADDRESS)
    logger.info("metrics on %s:%d", settings.QUOR_METRICS_ADDRESS, port)


def serve_multiprocess(port: int, *, collectors=()) -> None:
    """For a process whose children record metrics (forked, or started with its
    environment): from now on every process writes its values to files in a new
    directory, and this one serves their sum, and those of `collectors`. Call it before
    the first child and before any metric is used."""
    directory = tempfile.mkdtemp(prefix="quor-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
    values.ValueClass = values.MultiProcessValue()
    atexit.register(_remove_directory, directory, os.getpid())
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=directory)
    for collector in collectors:
        registry.register(collector)
    start_http_server(port, addr=settings.QUOR_METRICS_ADDRESS, registry=registry)
    logger.info(
        "metrics of this process and its children on %s:%d", settings.QUOR_METRICS_ADDRESS, port
    )


def forget_process(pid: int) -> None:
    """A child exited: its live gauges go (its counters and histograms stay counted)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.mark_process_dead(pid)


def _remove_directory(directory: str, owner: int) -> None:
    if os.getpid() == owner:  # not in a forked child that exits
        shutil.rmtree(directory, ignore_errors=True)
