"""A session's events: each is stored with the next seq of its session before it is
published to the session's viewers. The egress proxy records approvals here too, so this
module loads nothing of the sandbox lifecycle."""

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import connection, transaction
from django.db.models import Max
from django.utils import timezone
from psycopg.types.json import Jsonb

from quor.lib import metrics
from quor.models import User
from sandboxes.models import AgentEvent, Sandbox, Session
from sandboxes.signals import session_status_changed


def session_group(session_id) -> str:
    return f"session-{session_id}"


def viewer_group(user_id) -> str:
    """Every live event stream a user has open, whichever session it shows."""
    return f"viewer-{user_id}"


def viewers_disconnect(user_id) -> None:
    """Closes the user's open event streams (their access ended)."""
    async_to_sync(get_channel_layer().group_send)(
        viewer_group(user_id), {"type": "viewer.deactivated"}
    )


def serialize_event(event: AgentEvent) -> dict:
    return {
        "seq": event.seq,
        "kind": event.kind,
        "payload": event.payload,
        "created_at": event.created_at.isoformat(),
    }


def _publish(session_id, events: list[dict]) -> None:
    async_to_sync(session_events_publish)(session_id, events)


def newest_turn(session: Session) -> AgentEvent | None:
    """The `session_started` event of the session's newest turn."""
    return session.events.filter(kind="session_started").order_by("-seq").first()


def turn_started_at(session: Session):
    """When the session's newest turn started (None if it never had one)."""
    turn = newest_turn(session)
    return turn and turn.created_at


def session_events_append(
    *, session: Session, events: list[tuple[str, dict]], status_from=None, status_to=None
) -> list[AgentEvent]:
    """Stores events with consecutive seqs (the session row lock orders concurrent
    writers), then publishes them once the transaction has committed. A status change
    given with them (from `status_from` to `status_to`) commits with them, so a viewer
    who sees an event never finds the session in the state before it."""
    with transaction.atomic():
        Session.objects.select_for_update().filter(pk=session.pk).first()
        if status_to is not None:
            changed = Session.objects.filter(pk=session.pk, status__in=status_from).update(
                status=status_to, updated_at=timezone.now()
            )
            if changed and Session.Status.RUNNING in status_from:
                metrics.turn_ended(status_to, turn_started_at(session))
        last = session.events.aggregate(last=Max("seq"))["last"] or 0
        stored = AgentEvent.objects.bulk_create(
            AgentEvent(session=session, seq=last + number, kind=kind, payload=payload)
            for number, (kind, payload) in enumerate(events, start=1)
        )
        serialized = [serialize_event(event) for event in stored]
        # Stored either way: a viewer who misses it live (Redis down) gets it from the
        # backlog when it reconnects.
        transaction.on_commit(lambda: _publish(session.pk, serialized), robust=True)
        if status_to is not None:
            session_status_changed.send(Session, session=session, status=status_to)
    return stored


# The runtime's progress reports, in two statements of raw SQL (bench/event_stream.py:
# the ORM's way took about 8 queries' worth of Python per report). The first takes the
# session's row lock, as session_events_append does, and only if the credential is the
# session's sandbox's, its owner active, and the report is of the session's running turn.
# (Its status is checked again once the lock is held; the turn and the credential as the
# statement began, as the view checks them before it stores.)
_CLAIM_REPORTING_SESSION = f"""
UPDATE {Session._meta.db_table} AS s SET agent_seen_at = %s
FROM {Sandbox._meta.db_table} AS b, {User._meta.db_table} AS u
WHERE s.id = %s AND s.status = %s AND b.id = s.sandbox_id
  AND b.runtime_credential_hash = %s AND b.runtime_credential_hash <> ''
  AND u.id = b.user_id AND u.is_active
  AND (SELECT max(e.seq) FROM {AgentEvent._meta.db_table} AS e
       WHERE e.session_id = s.id AND e.kind = 'session_started') = %s
RETURNING s.id
"""  # noqa: S608 (table names from the models)
# A statement of its own: it reads the last seq after the lock is held.
_APPEND_EVENTS = f"""
INSERT INTO {AgentEvent._meta.db_table} (session_id, seq, kind, payload, created_at)
SELECT %s, last.seq + e.n, e.kind, e.payload, %s
FROM (SELECT coalesce(max(seq), 0) AS seq FROM {AgentEvent._meta.db_table}
      WHERE session_id = %s) AS last,
     unnest(%s::text[], %s::jsonb[]) WITH ORDINALITY AS e(kind, payload, n)
RETURNING seq, created_at
"""  # noqa: S608


def session_progress_append(
    *, session_id, credential_hash: str, turn: int, events: list[tuple[str, dict]]
) -> list[dict] | None:
    """Stores a report of progress (events that change no status) from the runtime of
    the session's sandbox, for the turn it runs, and returns the stored events as viewers
    get them; nothing is stored and None returned for any other report (another
    credential, an ended turn or session): the caller answers those as
    session_events_report does. The caller publishes."""
    now = timezone.now()  # Quor's clock, as the ORM's writes use
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            _CLAIM_REPORTING_SESSION,
            [now, session_id, Session.Status.RUNNING, credential_hash, turn],
        )
        if cursor.fetchone() is None:
            return None
        cursor.execute(
            _APPEND_EVENTS,
            [
                session_id,
                now,
                session_id,
                [kind for kind, _ in events],
                [Jsonb(payload) for _, payload in events],
            ],
        )
        stored = sorted(cursor.fetchall())
    metrics.events_ingested(kind for kind, _ in events)
    return [
        {"seq": seq, "kind": kind, "payload": payload, "created_at": created_at.isoformat()}
        for (seq, created_at), (kind, payload) in zip(stored, events, strict=True)
    ]


async def session_events_publish(session_id, events: list[dict]) -> None:
    """To the session's viewers (session_events_append publishes what it stores)."""
    await get_channel_layer().group_send(
        session_group(session_id), {"type": "agent.events", "events": events}
    )
