"""Chromium for the browser tests, in a network namespace of its own.

Chromium aborts what it is loading (net::ERR_NETWORK_CHANGED) when the host's network
interfaces change, and the Docker Engine adds and removes one for every sandbox that
starts or stops: with several test processes at once, that is every few seconds. A
user's browser never runs beside the sandboxes' bridge; here it runs in a namespace that
has only a loopback interface, where each port of this worker's block (tests/environment)
is relayed to the same port on the host's loopback: Quor's web tier, the web app proxy,
the identity provider."""

import asyncio
import concurrent.futures
import contextlib
import ctypes
import functools
import os
import socket
import subprocess
import threading
import time

from tests import environment

CHROMIUM = "/usr/bin/chromium"  # Debian's package (tools/provision); Playwright downloads none
# Without these, Chromium keeps calling home, which this machine's closed network refuses.
QUIET = [
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
NAMESPACE = f"quor-test-{environment.NAME}"
CLONE_NEWNET = 0x40000000


def outside_the_event_loop(function):
    """`function`, called in a thread of its own: there no event loop is marked running."""

    @functools.wraps(function)
    def in_a_thread(*args, **kwargs):
        with concurrent.futures.ThreadPoolExecutor(1) as thread:
            return thread.submit(function, *args, **kwargs).result()

    return in_a_thread


class NetworkLog:
    """The requests of a browser profile (every tab and frame) that failed or were never
    answered: printed when a test fails, since a wait that times out says only what it
    waited for, not which request it was left waiting on."""

    def __init__(self, context):
        self.unanswered = {}  # request -> when it was sent, until it is answered
        self.failed = []
        context.on("request", lambda r: self.unanswered.setdefault(r, time.strftime("%H:%M:%S")))
        context.on("requestfinished", lambda r: self.unanswered.pop(r, None))
        context.on("requestfailed", self._note_failure)

    def _note_failure(self, request):
        self.unanswered.pop(request, None)
        self.failed.append(f"{request.method} {request.url}: {request.failure}")

    def report(self) -> str:
        unanswered = [f"{sent} {r.method} {r.url}" for r, sent in self.unanswered.items()]
        failed = self.failed or "none"
        return f"requests never answered: {unanswered or 'none'}\nrequests that failed: {failed}"


class BrowserNetwork:
    """The namespace and the relay of its loopback ports to the host's."""

    def __init__(self):
        self.chromium = environment.RUN_DIR / "chromium"  # what Playwright launches
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        # The loop holds tasks weakly: a relay whose browser side has closed, still
        # waiting for the host side, would otherwise be collected half-done.
        self._relays = set()
        self._servers = []

    def start(self) -> None:
        self._remove_namespace()
        subprocess.run(["ip", "netns", "add", NAMESPACE], check=True)
        subprocess.run(["ip", "-n", NAMESPACE, "link", "set", "lo", "up"], check=True)
        environment.RUN_DIR.mkdir(parents=True, exist_ok=True)
        self.chromium.write_text(f'#!/bin/sh\nexec ip netns exec {NAMESPACE} {CHROMIUM} "$@"\n')
        self.chromium.chmod(0o755)
        ports = range(environment.FIRST_PORT, environment.FIRST_PORT + environment.PORT_BLOCK)
        listeners = _listen_in_namespace(ports)
        self._thread.start()
        for listener in listeners:
            asyncio.run_coroutine_threadsafe(self._serve(listener), self._loop).result()

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._remove_namespace()

    async def _serve(self, listener: socket.socket) -> None:
        port = listener.getsockname()[1]

        async def relay(browser_reader, browser_writer):
            task = asyncio.current_task()
            self._relays.add(task)
            task.add_done_callback(self._relays.discard)
            try:
                host_reader, host_writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                browser_writer.close()  # nothing listens there: refused, as it would be
                return
            try:
                await asyncio.gather(
                    _pipe(browser_reader, host_writer), _pipe(host_reader, browser_writer)
                )
            finally:  # an unclosed writer collected after the loop has closed warns
                host_writer.close()
                browser_writer.close()

        self._servers.append(await asyncio.start_server(relay, sock=listener))

    async def _close(self) -> None:
        """Ends every relay, so none is left pending when the loop stops."""
        for server in self._servers:
            server.close()
        for relay in self._relays:
            relay.cancel()
        await asyncio.gather(*self._relays, return_exceptions=True)

    @staticmethod
    def _remove_namespace() -> None:
        subprocess.run(["ip", "netns", "delete", NAMESPACE], capture_output=True, check=False)


async def _pipe(reader, writer) -> None:
    """Copies until the end of one direction, then ends that direction of the other."""
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        writer.close()


def _listen_in_namespace(ports) -> list[socket.socket]:
    """Listening sockets on the namespace's loopback. A socket stays in the namespace it
    was made in: a thread joins the namespace, makes them, and ends."""
    made, failure = [], []

    def make():
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(f"/run/netns/{NAMESPACE}", os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns")
            for port in ports:
                made.append(socket.create_server(("127.0.0.1", port)))
        except OSError as error:
            failure.append(error)
        finally:
            os.close(fd)

    thread = threading.Thread(target=make)
    thread.start()
    thread.join()
    if failure:
        for listener in made:
            with contextlib.suppress(OSError):
                listener.close()
        raise failure[0]
    return made
