"""Async test scenarios (WebSocket viewers in this process) run from sync tests."""

from asgiref.sync import async_to_sync
from channels.layers import DEFAULT_CHANNEL_LAYER, channel_layers


def run_scenario(scenario, *args):
    """Runs `scenario(*args)` in a new event loop with a channel layer of its own.

    channels_redis keeps asyncio locks on the layer object, and a receive cancelled while
    it waits for one (a viewer disconnecting in the middle of a burst) leaves that lock
    bound to its event loop for good. Each `async_to_sync` call has a new loop, so a
    layer shared between scenarios fails the next burst with "bound to a different event
    loop". Web processes run one loop for their whole life and never meet this."""
    channel_layers.backends.pop(DEFAULT_CHANNEL_LAYER, None)
    try:
        return async_to_sync(scenario)(*args)
    finally:
        channel_layers.backends.pop(DEFAULT_CHANNEL_LAYER, None)
