"""Channels' Redis pub/sub layer, with one reader at a time on its subscription.

A web process's subscriptions share one Redis connection, read by the layer's receive
loop. Subscribing (a viewer connecting) writes to it, and after a Redis restart it
connects it again, which reads the server's handshake: if the receive loop reads at
the same moment, asyncio refuses the second reader ("readuntil() called while another
coroutine is already waiting") and the viewer's connect fails. Here the loop reads
under a lock that subscribing and unsubscribing take too; the loop holds it at most
READ_S while no message comes, which is what a connect may wait for.
"""

import asyncio
import logging

from channels_redis.pubsub import RedisPubSubChannelLayer, RedisSingleShardConnection

READ_S = 0.05
logger = logging.getLogger(__name__)


class _ShardWithOneReader(RedisSingleShardConnection):
    def __init__(self, host, channel_layer):
        super().__init__(host, channel_layer)
        self._reading = asyncio.Lock()

    async def subscribe(self, channel):
        async with self._reading:
            await super().subscribe(channel)

    async def unsubscribe(self, channel):
        async with self._reading:
            await super().unsubscribe(channel)

    async def _do_receiving(self):
        while True:
            try:
                if not (self._pubsub and self._pubsub.subscribed):
                    await asyncio.sleep(READ_S)
                    continue
                async with self._reading:  # fair: a waiting subscriber goes first
                    message = await self._pubsub.get_message(
                        ignore_subscribe_messages=True, timeout=READ_S
                    )
                self._receive_message(message)
            except Exception:
                logger.exception("The channel layer's subscription failed; connecting again")
                await asyncio.sleep(1)


class ChannelLayer(RedisPubSubChannelLayer):
    def _get_layer(self):
        new = asyncio.get_running_loop() not in self._layers
        layer = super()._get_layer()
        if new:
            layer._shards = [_ShardWithOneReader(shard.host, layer) for shard in layer._shards]
        return layer
