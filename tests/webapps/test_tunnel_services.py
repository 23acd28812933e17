"""The tunnel services in the test process: what an opening refuses, and how a tunnel
ends (its owner, its TTL). The relay itself, with Quor's processes and the client, is
tested in test_tunnels.py."""

import asyncio
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer
from django.utils import timezone

from quor.lib.errors import AccessDenied, InvalidInput
from quor.models import AuditEntry
from webapps import tunnels
from webapps.models import Tunnel

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("tunnels_allowed")]


@pytest.fixture
def tunnels_allowed(settings):
    """Tunnels are off unless a deployment sets a number (QUOR_TUNNELS_MAX)."""
    settings.QUOR_TUNNELS_MAX = 4


@pytest.mark.parametrize("port", [0, 65536, -1, "8080", True, 8080.0])
def test_a_port_that_is_not_a_whole_number_in_range_opens_nothing(owner, port):
    with pytest.raises(InvalidInput) as refused:
        tunnels.tunnel_open(user=owner, port=port, channel="unused")
    assert refused.value.code == "tunnels.invalid_port"
    assert not Tunnel.objects.exists()


def test_a_deployment_without_tunnels_refuses_every_opening(owner, settings):
    settings.QUOR_TUNNELS_MAX = 0
    with pytest.raises(AccessDenied) as refused:
        tunnels.tunnel_open(user=owner, port=8080, channel="unused")
    assert refused.value.code == "tunnels.disabled"
    assert not Tunnel.objects.exists()


def test_the_owner_ending_a_tunnel_tells_its_consumer_at_once_and_removes_its_route(owner):
    layer = get_channel_layer()

    async def end_as_the_consumer_listens():
        channel = await layer.new_channel()  # the consumer's, as its client connects
        tunnel = await sync_to_async(tunnels.tunnel_open)(user=owner, port=8080, channel=channel)
        assert await sync_to_async(tunnels.tunnel_channel)(tunnel.label) == channel
        await sync_to_async(tunnels.tunnel_end)(user=owner, tunnel=tunnel)
        return tunnel, await asyncio.wait_for(layer.receive(channel), timeout=5)

    tunnel, message = async_to_sync(end_as_the_consumer_listens)()

    assert message == {"type": "tunnel.end", "reason": "closed"}
    assert tunnels.tunnel_channel(tunnel.label) is None
    assert not tunnels.tunnels_of(owner).exists()
    tunnel.refresh_from_db()
    assert tunnel.close_reason == "closed"
    assert AuditEntry.objects.get(action="tunnel.closed").actor == owner


def test_closing_a_closed_tunnel_changes_nothing(owner):
    tunnel = tunnels.tunnel_open(user=owner, port=8080, channel="unused")
    assert tunnels.tunnel_close(tunnel=tunnel, reason="closed") is True
    assert tunnels.tunnel_close(tunnel=tunnel, reason="lost") is False
    tunnel.refresh_from_db()
    assert tunnel.close_reason == "closed"
    assert AuditEntry.objects.filter(action="tunnel.closed").count() == 1


def test_the_beat_closes_a_tunnel_past_its_ttl_as_expired_and_a_live_one_not(owner, colleague):
    old = tunnels.tunnel_open(user=owner, port=8080, channel="old")
    live = tunnels.tunnel_open(user=colleague, port=8080, channel="live")
    Tunnel.objects.filter(pk=old.pk).update(expires_at=timezone.now() - timedelta(seconds=1))

    assert tunnels.tunnels_close_lost() == 1

    old.refresh_from_db()
    live.refresh_from_db()
    assert (old.close_reason, live.closed_at) == ("expired", None)
    assert tunnels.tunnel_channel(old.label) is None
    assert tunnels.tunnel_channel(live.label) == "live"
