"""A session's events: each is stored with the next seq of its session before it is
published to the session's viewers. The egress proxy records approvals here too, so this
module loads nothing of the sandbox lifecycle."""

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from quor.lib import metrics
from sandboxes.models import AgentEvent, Session
from sandboxes.signals import session_status_changed


def session_group(session_id) -> str:
    return f"session-{session_id}"


def serialize_event(event: AgentEvent) -> dict:
    return {
        "seq": event.seq,
        "kind": event.kind,
        "payload": event.payload,
        "created_at": event.created_at.isoformat(),
    }


def _publish(session_id, events: list[dict]) -> None:
    layer = get_channel_layer()
    async_to_sync(layer.group_send)(
        session_group(session_id), {"type": "agent.events", "events": events}
    )


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
