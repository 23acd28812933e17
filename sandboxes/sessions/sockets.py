"""What every WebSocket on a session checks before it accepts (the events, the terminal)."""

from quor.lib.errors import QuorError
from quor.lib.kept_connections import on_kept_connection
from quor.lib.permissions import require_permission
from sandboxes.runtime import services
from sandboxes.sessions.events import viewer_group

CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_NOT_FOUND = 4404

_require_permission = on_kept_connection(require_permission)
_session_in_use = on_kept_connection(services.session_in_use)


async def session_of_socket(consumer):
    """The session the socket's URL names, once its user may use it; otherwise the socket
    is closed (4401, 4403, 4404) and the answer is None. The consumer joins its viewer's
    group before the checks, so a deactivation that lands while they run still closes it."""
    user = consumer.scope.get("user")
    if user is None or not user.is_authenticated:
        await consumer.close(code=CLOSE_UNAUTHENTICATED)
        return None
    consumer.viewer_group = viewer_group(user.pk)
    await consumer.channel_layer.group_add(consumer.viewer_group, consumer.channel_name)
    try:
        await _require_permission(user, consumer.required_permission)
    except QuorError:
        await consumer.close(code=CLOSE_FORBIDDEN)
        return None
    try:
        return await _session_in_use(user, consumer.scope["url_route"]["kwargs"]["session_id"])
    except QuorError:
        await consumer.close(code=CLOSE_NOT_FOUND)
        return None
