"""A small thread-safe cache for what the proxy keeps per process (TLS contexts, DNS
answers): bounded, so that a sandbox asking for endless names cannot grow it."""

import threading
from collections import OrderedDict


class LruCache:
    """At most `size` entries, the least recently used dropped first; thread-safe."""

    def __init__(self, size: int):
        self._size = size
        self._lock = threading.Lock()
        self._entries: OrderedDict = OrderedDict()

    def get(self, key):
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
            return value

    def put(self, key, value) -> None:
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)

    def discard(self, key) -> None:
        with self._lock:
            self._entries.pop(key, None)
