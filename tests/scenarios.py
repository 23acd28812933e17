"""Async test scenarios (WebSocket viewers in this process) run from sync tests."""

from asgiref.sync import async_to_sync
from channels.layers import DEFAULT_CHANNEL_LAYER, channel_layers

# A viewer's connect reads its session and the database in threads of their own; with
# the suite's processes at once on two cores, that can take longer than the one second
# the communicator waits by default. The wait ends as soon as the answer comes.
CONNECT_TIMEOUT_S = 10


def run_scenario(scenario, *args):
    """Runs `scenario(*args)` in a new event loop with a channel layer of its own, so
    that no scenario meets the subscriptions another one left."""
    channel_layers.backends.pop(DEFAULT_CHANNEL_LAYER, None)
    try:
        return async_to_sync(scenario)(*args)
    finally:
        channel_layers.backends.pop(DEFAULT_CHANNEL_LAYER, None)
