"""Waking the proxy that holds a parked request, through Redis publish/subscribe
(and telling proxies that Apps, policies or credentials changed).

Only a speed-up: a decision is published after its row is committed, and a proxy
that misses it (Redis down, a lost message) settles the request from PostgreSQL,
which fails closed unless an approval is recorded there."""

import functools
import json
import logging
import threading
import time

import redis
from django.conf import settings

logger = logging.getLogger(__name__)

LOST = "lost"  # the listener lost Redis while the request was parked
# Grants announced through Redis are kept until the proxy's directory surely has them.
GRANT_MEMORY_SECONDS = 600


def channel() -> str:
    return f"quor:approvals:{settings.QUOR_DEPLOYMENT}"


@functools.cache
def _publisher() -> redis.Redis:
    """One connection pool per process: a decision should not pay for a connection."""
    return redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2, socket_timeout=2)


def publish(decisions: list[dict], *, grants=()) -> None:
    """decisions: [{"id", "status"}]; grants: [[session id, app id, action key]]."""
    message = json.dumps({"decisions": decisions, "grants": list(grants)})
    try:
        _publisher().publish(channel(), message)
    except redis.RedisError:
        logger.warning("could not publish an approval decision; the proxy will read it later")


def publish_config_changed() -> None:
    """Apps, policies or credentials changed: proxies reload their snapshot now rather
    than within their refresh interval (a removed credential must stop at once)."""
    try:
        _publisher().publish(channel(), json.dumps({"config_changed": True}))
    except redis.RedisError:
        logger.warning("could not tell the proxies about a change; they reload within 2 s")


class _Waiter:
    def __init__(self):
        self.event = threading.Event()
        self.status = None


class DecisionListener:
    """One subscriber thread per proxy process; parked request threads wait on it."""

    def __init__(self, health_check_seconds: float = 2.0, on_config_changed=None):
        self.health_check_seconds = health_check_seconds
        self.on_config_changed = on_config_changed
        self._lock = threading.Lock()
        self._waiters: dict[str, _Waiter] = {}
        self._grants: dict[str, tuple[float, set[tuple[int, str]]]] = {}
        self._subscribed = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="egress-approvals", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Within about a second; parked requests fail closed."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(10)

    def wait_until_subscribed(self, timeout: float) -> bool:
        return self._subscribed.wait(timeout)

    def expect(self, approval_id: str) -> None:
        """Registers interest before the row exists, so no decision can come too early."""
        with self._lock:
            self._waiters[approval_id] = _Waiter()

    def wait(self, approval_id: str, timeout: float) -> str | None:
        """The status the decision announced, LOST, or None for no word within timeout."""
        with self._lock:
            waiter = self._waiters[approval_id]
        waiter.event.wait(max(timeout, 0))
        return waiter.status

    def forget(self, approval_id: str) -> None:
        with self._lock:
            self._waiters.pop(approval_id, None)

    def grants_for(self, session_id: str) -> frozenset[tuple[int, str]]:
        """Session grants announced since the directory's last snapshot."""
        with self._lock:
            return frozenset(self._grants.get(session_id, (0, ()))[1])

    def _deliver(self, raw: bytes) -> None:
        message = json.loads(raw)
        if message.get("config_changed") and self.on_config_changed:
            self.on_config_changed()
        now = time.monotonic()
        with self._lock:
            for session_id in [
                s for s, (at, _) in self._grants.items() if now - at > GRANT_MEMORY_SECONDS
            ]:
                del self._grants[session_id]
            for session_id, app_id, key in message.get("grants", []):
                _, keys = self._grants.get(session_id, (now, set()))
                keys.add((int(app_id), key))
                self._grants[session_id] = (now, keys)
            for decision in message.get("decisions", []):
                waiter = self._waiters.get(decision["id"])
                if waiter is not None:
                    waiter.status = decision["status"]
                    waiter.event.set()

    def _fail_all(self) -> None:
        with self._lock:
            for waiter in self._waiters.values():
                waiter.status = LOST
                waiter.event.set()

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                client = redis.Redis.from_url(
                    settings.REDIS_URL,
                    socket_connect_timeout=2,
                    socket_timeout=self.health_check_seconds + 3,
                    health_check_interval=self.health_check_seconds,
                )
                pubsub = client.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(channel())
                pubsub.get_message(timeout=2)  # the subscribe confirmation
                self._subscribed.set()
                while not self._stopping.is_set():
                    message = pubsub.get_message(timeout=1.0)
                    if message and message.get("type") == "message":
                        self._deliver(message["data"])
                pubsub.close()
                client.close()
            except Exception:
                if self._subscribed.is_set():
                    logger.warning("lost Redis: parked requests fail closed", exc_info=True)
                self._subscribed.clear()
                self._fail_all()
                self._stopping.wait(1)
        self._subscribed.clear()
        self._fail_all()
