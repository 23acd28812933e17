"""Local relay tunnels: a `quor tunnel PORT` client's outbound WebSocket
(webapps/consumers.py) gets an exact host, `t<32 hex>.<app base host>`, that the web
app proxy relays to the client while it is connected (webapps/relay.py), within the
deployment's bounds: how many are open, a hard TTL, the body size.

A tunnel's route is its row (open, not expired) and its heartbeat key in Redis, which
its consumer renews every few seconds: a web process that dies without a word leaves no
route behind for longer than the key's TTL."""

from datetime import timedelta

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from quor.audit import audit_record
from quor.lib.errors import AccessDenied, InvalidInput, NotFound, QuorError
from quor.lib.permissions import Permission, require_permission
from quor.lib.throttling import redis_client
from webapps.models import Tunnel
from webapps.services import app_origin, may_view, sharing_change

PREFIX = "t"
HEARTBEAT_SECONDS = 3
# The route outlives a silent web process by at most this long.
HEARTBEAT_TTL_SECONDS = 10
# Every tunnel opening takes this PostgreSQL advisory lock, so that two web processes
# cannot both see room for one more.
OPEN_LOCK = 0x7175_6F72_7475_6E  # "quortun"
# Closed tunnels are listed nowhere; their rows go after this (the audit log keeps
# their opening and closing for QUOR_AUDIT_RETENTION_DAYS).
CLOSED_KEPT = timedelta(days=7)


class TooManyTunnels(QuorError):
    status = 429
    code = "tunnels.too_many"


def is_tunnel_label(label: str) -> bool:
    return label.startswith(PREFIX) and len(label) == 33


def _heartbeat_key(label: str) -> str:
    return f"quor:tunnel:{label}"


def tunnel_url(tunnel: Tunnel) -> str:
    return app_origin().origin(tunnel.label) + "/"


def tunnel_open(*, user, port, channel: str) -> Tunnel:
    """A client connected: its tunnel, if the deployment's and the user's counts allow
    one more. Its route exists from here (the heartbeat key names `channel`)."""
    membership = require_permission(user, Permission.SANDBOX_USE)
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise InvalidInput("port must be a number from 1 to 65535.", code="tunnels.invalid_port")
    if settings.QUOR_TUNNELS_MAX <= 0:
        raise AccessDenied("This deployment does not allow relay tunnels.", code="tunnels.disabled")
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [OPEN_LOCK])
        tunnels_close_lost()
        open_tunnels = Tunnel.objects.filter(closed_at=None)
        if open_tunnels.count() >= settings.QUOR_TUNNELS_MAX:
            raise TooManyTunnels("The deployment has as many tunnels open as it allows.")
        if open_tunnels.filter(owner=user).count() >= settings.QUOR_TUNNELS_PER_USER:
            raise TooManyTunnels(
                f"You have {settings.QUOR_TUNNELS_PER_USER} tunnels open, as many as allowed.",
                code="tunnels.too_many_for_user",
            )
        tunnel = Tunnel.objects.create(
            owner=user,
            organization=membership.organization,
            port=port,
            expires_at=timezone.now() + timedelta(seconds=settings.QUOR_TUNNEL_TTL_SECONDS),
        )
        redis_client().set(_heartbeat_key(tunnel.label), channel, ex=HEARTBEAT_TTL_SECONDS)
        audit_record(
            "tunnel.opened",
            target=tunnel,
            organization=membership.organization,
            changes={"port": [None, port]},
            actor=user,
        )
    return tunnel


def tunnel_heartbeat(tunnel: Tunnel) -> bool:
    """Renews the route; False when it is gone (closed through the API or by the beat,
    or the key lapsed): the client's connection must end."""
    return bool(redis_client().expire(_heartbeat_key(tunnel.label), HEARTBEAT_TTL_SECONDS))


def tunnel_close(*, tunnel: Tunnel, reason: str, actor=None) -> bool:
    """Ends the tunnel and its route at once (a conditional update: closing twice is
    harmless). Its client's connection closes at its consumer's next heartbeat."""
    with transaction.atomic():
        closed = Tunnel.objects.filter(pk=tunnel.pk, closed_at=None).update(
            closed_at=timezone.now(), close_reason=reason
        )
        if closed:
            audit_record(
                "tunnel.closed",
                target=tunnel,
                organization=tunnel.organization,
                changes={"close_reason": ["", reason]},
                actor=actor,
            )
    redis_client().delete(_heartbeat_key(tunnel.label))
    return bool(closed)


def tunnels_close_lost() -> int:
    """Closes open tunnels past their TTL or whose heartbeat is gone (the web process
    holding them died): run by the beat, and before each opening counts."""
    closed = 0
    now = timezone.now()
    for tunnel in Tunnel.objects.filter(closed_at=None).select_related("organization"):
        if tunnel.expires_at <= now:
            closed += tunnel_close(tunnel=tunnel, reason="expired")
        elif not redis_client().exists(_heartbeat_key(tunnel.label)):
            closed += tunnel_close(tunnel=tunnel, reason="lost")
    return closed


def tunnels_delete_closed() -> int:
    """Deletes the rows of tunnels closed more than CLOSED_KEPT ago."""
    deleted, _ = Tunnel.objects.filter(closed_at__lt=timezone.now() - CLOSED_KEPT).delete()
    return deleted


def tunnel_channel(label: str) -> str | None:
    """The channel of the consumer holding the tunnel, while its heartbeat lives."""
    value = redis_client().get(_heartbeat_key(label))
    return value.decode() if value else None


def tunnel_for_viewer(user, label: str) -> tuple[Tunnel, str] | None:
    """(tunnel, its consumer's channel) if the tunnel is open now and the viewer may
    use it: its creator, or anyone of the organization once shared, as for web apps."""
    tunnel = (
        Tunnel.objects.select_related("owner__membership__organization")
        .filter(label=label, closed_at=None, expires_at__gt=timezone.now())
        .first()
    )
    if tunnel is None:
        return None
    shared = tunnel.sharing == Tunnel.Sharing.ORGANIZATION
    if not may_view(user, tunnel.owner, shared):
        return None
    channel = tunnel_channel(label)
    return (tunnel, channel) if channel else None


def tunnels_of(user):
    """The user's open tunnels."""
    return Tunnel.objects.filter(owner=user, closed_at=None, expires_at__gt=timezone.now())


def get_tunnel_for_owner(user, tunnel_id) -> Tunnel:
    tunnel = tunnels_of(user).filter(pk=tunnel_id).select_related("organization").first()
    if tunnel is None:
        raise NotFound("No such tunnel.", code="tunnels.not_found")
    return tunnel


def tunnel_set_sharing(*, user, tunnel: Tunnel, sharing: str) -> Tunnel:
    return sharing_change(
        user=user, shared=tunnel, sharing=sharing, error_code="tunnels.invalid_sharing"
    )


def tunnel_end(*, user, tunnel: Tunnel) -> None:
    """Closed by its owner through the API: the client's socket closes at once."""
    channel = tunnel_channel(tunnel.label)
    if tunnel_close(tunnel=tunnel, reason="closed", actor=user) and channel:
        async_to_sync(get_channel_layer().send)(channel, {"type": "tunnel.end", "reason": "closed"})


def tunnel_payload(tunnel: Tunnel) -> dict:
    return {
        "id": str(tunnel.pk),
        "url": tunnel_url(tunnel),
        "port": tunnel.port,
        "sharing": tunnel.sharing,
        "created_at": tunnel.created_at,
        "expires_at": tunnel.expires_at,
    }
