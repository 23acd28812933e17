"""Quor's channel layer against the real Redis: subscriptions made while the layer's
subscription connection is being connected again all work."""

import asyncio

import pytest
import redis
from django.conf import settings

from quor.lib.channel_layer import ChannelLayer
from tests import environment

CLIENT_NAME = f"quor-test-channel-layer-{environment.NAME}"  # this worker's only
ROUNDS = 15
NEW_VIEWERS = 8


def kill_the_layers_subscription() -> bool:
    """As a Redis restart does to it, from the server's side."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        ids = [c["id"] for c in client.client_list(_type="pubsub") if c["name"] == CLIENT_NAME]
        for client_id in ids:
            client.client_kill_filter(_id=client_id)
        return bool(ids)
    finally:
        client.close()


async def join(layer, group):
    channel = await layer.new_channel()
    await layer.group_add(group, channel)
    return channel


async def everyone_receives(layer, group, channels):
    await layer.group_send(group, {"type": "hello"})
    return [await layer.receive(channel) for channel in channels]


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_viewers_joining_while_the_subscription_reconnects_all_join(round_):
    config = settings.CHANNEL_LAYERS["default"]["CONFIG"]
    layer = ChannelLayer(
        **{**config, "hosts": [{**config["hosts"][0], "client_name": CLIENT_NAME}]}
    )

    async def scenario():
        async with asyncio.timeout(30):
            return await joins_during_reconnection()

    async def joins_during_reconnection():
        group = f"test-layer-{round_}"
        first = await join(layer, group)
        assert await everyone_receives(layer, group, [first]) == [{"type": "hello"}]
        assert await asyncio.to_thread(kill_the_layers_subscription)
        await asyncio.sleep(round_ % 5 * 0.01)  # meet the reconnection at different points
        joined = await asyncio.gather(*(join(layer, group) for _ in range(NEW_VIEWERS)))
        received = await everyone_receives(layer, group, [first, *joined])
        await layer.flush()
        return received

    assert asyncio.run(scenario()) == [{"type": "hello"}] * (NEW_VIEWERS + 1)
