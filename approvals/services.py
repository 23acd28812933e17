"""Approval requests: recorded by the egress proxy, decided by the session owner.

PostgreSQL is the truth: a parked request is forwarded with a credential only when
its row says approved. Every decision goes through one conditional update
(`status = pending`), so the user, the proxy's timeout and a cancelled turn cannot
both win. Redis only wakes the waiting proxy (`approvals.wakeup`)."""

import re
import uuid
from datetime import timedelta
from urllib.parse import unquote_plus

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from approvals import wakeup
from approvals.models import ApprovalRequest, SessionGrant
from quor.audit import audit_record, organization_of
from quor.lib import metrics
from quor.lib.errors import Conflict, InvalidInput, NotFound
from sandboxes.models import Session
from sandboxes.sessions.events import session_events_append

DECISIONS = {
    "approve_once": (ApprovalRequest.Status.APPROVED, ApprovalRequest.DecidedVia.USER),
    "approve_session": (
        ApprovalRequest.Status.APPROVED,
        ApprovalRequest.DecidedVia.SESSION_GRANT,
    ),
    "reject": (ApprovalRequest.Status.REJECTED, ApprovalRequest.DecidedVia.USER),
}


# What the approval card shows of a request's body: enough to judge it, never all of it.
BODY_PREVIEW_CHARS = 2000
_CONTROL_CHARACTERS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


# Names of fields whose values are masked in the preview, which is kept with the
# approval and its event: password, client_secret, access_token, apiKey, Authorization...
# (not max_tokens or author).
_SECRET_NAME = re.compile(
    r"passw|passphrase|pwd|secret|token(?!s)|api_?key|access_?key|private_?key|authoriz|auth(?!or)"
    r"|credential|cookie|signature|^pin$|^key$",
    re.IGNORECASE,
)
MASK = "***"  # as the query values of URLs (egress.audit.mask_path)
# A form-encoded body: name=value pairs joined by "&", nothing else.
_FORM_BODY = re.compile(r"[^\s=&]+=[^\s&]*(?:&[^\s=&]+(?:=[^\s&]*)?)*&?")
# A JSON member whose value is a string; the string may be cut off by the preview's end.
_JSON_STRING_MEMBER = re.compile(r'"((?:[^"\\]|\\.)*)"(\s*:\s*)"(?:[^"\\]|\\.)*("|\\?$)')


def _is_secret_name(name: str) -> bool:
    return bool(_SECRET_NAME.search(name.replace("-", "_")))


def mask_secrets(text: str) -> str:
    """`text` with the values of secret-looking fields masked, in a form-encoded body
    (`client_secret=***`) or in JSON (`"token": "***"`), even JSON cut off at the end.
    Only strings are masked in JSON (`"max_tokens": 100` stays)."""
    stripped = text.strip()
    if not stripped.startswith(("{", "[")) and _FORM_BODY.fullmatch(stripped):
        pairs = []
        for pair in text.split("&"):
            name, sep, _ = pair.partition("=")
            secret = sep and _is_secret_name(unquote_plus(name))
            pairs.append(f"{name}={MASK}" if secret else pair)
        return "&".join(pairs)

    def member(match):
        if not _is_secret_name(match[1]):
            return match[0]
        return f'"{match[1]}"{match[2]}"{MASK}"'

    return _JSON_STRING_MEMBER.sub(member, text)


def request_body_preview(body: bytes | None) -> str:
    """The start of a request body as text for people: UTF-8 (binary data is only
    named), control characters but line breaks and tabs removed, values of
    secret-looking fields masked, bounded."""
    if not body:
        return ""
    head = body[: BODY_PREVIEW_CHARS * 4]
    if b"\x00" in head:
        return f"(binary data, {len(body)} bytes)"
    text = mask_secrets(_CONTROL_CHARACTERS.sub("", head.decode("utf-8", "replace")))
    if len(text) > BODY_PREVIEW_CHARS or len(head) < len(body):
        return text[:BODY_PREVIEW_CHARS] + f"… ({len(body)} bytes in all)"
    return text


def approval_payload(approval: ApprovalRequest) -> dict:
    """What the session page, the API and the events show of an approval."""
    return {
        "id": str(approval.pk),
        "session": str(approval.session_id),
        "app": approval.app_name,
        "actions": approval.actions,
        "method": approval.method,
        "url": approval.url,
        "summary": approval.summary,
        "body_preview": approval.body_preview,
        "status": approval.status,
        "decided_via": approval.decided_via,
        "created_at": approval.created_at.isoformat(),
        "expires_at": approval.expires_at.isoformat(),
        "decided_at": approval.decided_at.isoformat() if approval.decided_at else None,
    }


def _covered(session_id, app_id, keys) -> bool:
    if not keys:
        return False
    granted = set(
        SessionGrant.objects.filter(
            session_id=session_id, app_id=app_id, action_key__in=keys
        ).values_list("action_key", flat=True)
    )
    return granted >= set(keys)


def park_request_for_approval(
    *,
    approval_id: uuid.UUID,
    session_id,
    app_id: int,
    app_name: str,
    actions: list[dict],
    method: str,
    url: str,
    summary: str,
    body: bytes = b"",
) -> ApprovalRequest | None:
    """Records a parked request and sends its card to the session; None when a grant
    for this session already covers it (it landed after the proxy's snapshot). The card
    shows the start of the request's body (`body`)."""
    keys = [a["key"] for a in actions if a["policy"] == "ask"]
    with transaction.atomic():
        session = _lock_session(session_id)
        if _covered(session.pk, app_id, keys):
            return None
        approval = ApprovalRequest.objects.create(
            id=approval_id,
            session=session,
            app_id=app_id,
            app_name=app_name[:100],
            actions=actions,
            method=method[:16],
            url=url,
            summary=summary[:300],
            body_preview=request_body_preview(body),
            expires_at=timezone.now() + timedelta(seconds=settings.QUOR_APPROVAL_TIMEOUT_SECONDS),
        )
        session_events_append(
            session=session,
            events=[("approval_requested", {"approval": approval_payload(approval)})],
        )
    return approval


def _lock_session(session_id) -> Session:
    """Every writer locks the session row before its approval rows: one order, no
    deadlock between two decisions (or a decision and the proxy) in one session."""
    return Session.objects.select_for_update().get(pk=session_id)


def _decide(approval_ids, status, via, user=None) -> list[ApprovalRequest]:
    """The race arbiter: only rows still pending change; returns those that did.
    The caller holds the session's lock."""
    now = timezone.now()
    changed = list(
        ApprovalRequest.objects.select_for_update()
        .filter(pk__in=approval_ids, status=ApprovalRequest.Status.PENDING)
        .order_by("created_at")
    )
    for approval in changed:
        approval.status, approval.decided_via = status, via
        approval.decided_by, approval.decided_at = user, now
        approval.save(update_fields=["status", "decided_via", "decided_by", "decided_at"])
        metrics.approval_decided(status=status, created_at=approval.created_at, decided_at=now)
    return changed


def _announce(session, decided: list[ApprovalRequest], grants=()) -> None:
    """Wakes the proxy first (registered before the session's event, and robust): the
    agent is waiting on it, and a failing viewer update must not hold it up."""
    if not decided:
        return
    messages = [{"id": str(a.pk), "status": a.status} for a in decided]
    transaction.on_commit(lambda: wakeup.publish(messages, grants=grants), robust=True)
    session_events_append(
        session=session,
        events=[("approval_decided", {"approval": approval_payload(a)}) for a in decided],
    )


def get_approval_for_owner(user, approval_id) -> ApprovalRequest:
    """An approval request of one of the user's sessions; anyone else's is 404."""
    found = ApprovalRequest.objects.filter(pk=approval_id, session__owner=user).first()
    if found is None:
        raise NotFound("No such approval request.", code="approvals.not_found")
    return found


def decide_approval(*, user, approval_id, decision: str) -> ApprovalRequest:
    """The session owner's answer. Anyone else: 404. Twice or too late: 409, no change."""
    if decision not in DECISIONS:
        raise InvalidInput(
            f"decision must be one of {', '.join(DECISIONS)}.", code="approvals.invalid_decision"
        )
    status, via = DECISIONS[decision]
    found = get_approval_for_owner(user, approval_id)
    with transaction.atomic():
        _lock_session(found.session_id)
        approval = ApprovalRequest.objects.select_related("session").get(pk=found.pk)
        if approval.status != ApprovalRequest.Status.PENDING:
            raise Conflict(
                f"This request was already decided ({approval.status}).",
                code="approvals.already_decided",
            )
        if approval.expires_at <= timezone.now():
            raise Conflict(
                "This request expired; the agent was told it was not approved.",
                code="approvals.expired",
            )
        decided = _decide([approval.pk], status, via, user)
        audit_record(
            "approval.decided",
            target=approval,
            organization=organization_of(approval.session.owner),
            changes={"decision": decision, "app": approval.app_name, "summary": approval.summary},
            actor=user,
        )
        grants = []
        if decision == "approve_session" and approval.app_id is not None:
            grants = _grant_for_session(approval)
            decided += _approve_covered_requests(approval, user)
        _announce(approval.session, decided, grants)
    approval.refresh_from_db()
    return approval


def _grant_for_session(approval: ApprovalRequest) -> list[list]:
    grants = []
    for key in approval.action_keys:
        SessionGrant.objects.get_or_create(
            session_id=approval.session_id,
            app_id=approval.app_id,
            action_key=key,
            defaults={"approval": approval},
        )
        grants.append([str(approval.session_id), approval.app_id, key])
    return grants


def _approve_covered_requests(approval: ApprovalRequest, user) -> list[ApprovalRequest]:
    """Other requests of the session parked for actions the new grant covers."""
    others = ApprovalRequest.objects.filter(
        session_id=approval.session_id,
        app_id=approval.app_id,
        status=ApprovalRequest.Status.PENDING,
        expires_at__gt=timezone.now(),
    ).exclude(pk=approval.pk)
    covered = [o.pk for o in others if _covered(o.session_id, o.app_id, o.action_keys)]
    return _decide(
        covered, ApprovalRequest.Status.APPROVED, ApprovalRequest.DecidedVia.SESSION_GRANT, user
    )


def approval_settle(approval_id) -> str:
    """For the proxy when it stops waiting (timeout, lost signal): expires the request
    unless a decision is already recorded, and returns the final status."""
    with transaction.atomic():
        approval = ApprovalRequest.objects.select_related("session").get(pk=approval_id)
        _lock_session(approval.session_id)
        decided = _decide(
            [approval.pk], ApprovalRequest.Status.EXPIRED, ApprovalRequest.DecidedVia.PROXY
        )
        _announce(approval.session, decided)
    approval.refresh_from_db()
    return approval.status


def approvals_expire_for_session(session: Session) -> int:
    """A cancelled turn: its parked requests fail at once."""
    with transaction.atomic():
        _lock_session(session.pk)
        pending = session.approval_requests.filter(status=ApprovalRequest.Status.PENDING)
        decided = _decide(
            list(pending.values_list("pk", flat=True)),
            ApprovalRequest.Status.EXPIRED,
            ApprovalRequest.DecidedVia.CANCEL,
        )
        _announce(session, decided)
    return len(decided)


def approvals_expire_stale() -> int:
    """Requests whose proxy went away (restart, crash) stay pending past their expiry:
    mark them, so the session page stops offering a decision."""
    stale = ApprovalRequest.objects.filter(
        status=ApprovalRequest.Status.PENDING, expires_at__lt=timezone.now()
    ).values_list("pk", flat=True)[:500]
    count = 0
    for approval_id in list(stale):
        count += approval_settle(approval_id) == ApprovalRequest.Status.EXPIRED
    return count


def approvals_of_session(session: Session, *, status: str | None = None):
    approvals = session.approval_requests.all()
    if status:
        if status not in ApprovalRequest.Status.values:
            raise InvalidInput(
                f"status must be one of {', '.join(ApprovalRequest.Status.values)}.",
                code="approvals.invalid_status",
            )
        approvals = approvals.filter(status=status)
    return approvals
