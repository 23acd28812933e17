"""How the web app proxy relays a response body, against a small app server on loopback
(no sandbox) and a viewer that behaves as uvicorn does: once the viewer has gone,
`send()` quietly does nothing and `receive()` says `http.disconnect`."""

import asyncio

from aiohttp import web

from webapps.proxy import WebAppProxy

SCOPE = {
    "type": "http",
    "method": "GET",
    "query_string": b"",
    "headers": [(b"host", b"wabc.localhost:18001")],
}


class Viewer:
    def __init__(self, leave_after_chunks=None):
        self.messages = []
        self.leave_after_chunks = leave_after_chunks
        self.gone = asyncio.Event()
        self.asked = 0

    async def receive(self):
        self.asked += 1
        if self.asked == 1:
            return {"type": "http.request", "body": b"", "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message):
        if self.gone.is_set():
            return
        self.messages.append(message)
        chunks = sum(1 for m in self.messages if m.get("body"))
        if self.leave_after_chunks is not None and chunks >= self.leave_after_chunks:
            self.gone.set()

    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages[1:])


async def with_app(scenario):
    app_closed = asyncio.Event()

    async def endless(request):
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            while True:
                await response.write(b"data: tick\n\n")
                await asyncio.sleep(0.01)
        finally:
            app_closed.set()

    async def chunked(request):
        response = web.StreamResponse()
        await response.prepare(request)
        for _ in range(100):
            await response.write(b"x" * 10_000)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/events", endless)
    app.router.add_get("/chunked", chunked)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    proxy = WebAppProxy()
    try:
        await scenario(proxy, ("127.0.0.1", port), app_closed)
    finally:
        await proxy.close()
        await runner.cleanup()


def test_an_endless_response_stops_when_the_viewer_leaves():
    async def scenario(proxy, address, app_closed):
        viewer = Viewer(leave_after_chunks=3)
        scope = {**SCOPE, "path": "/events", "raw_path": b"/events"}
        await asyncio.wait_for(proxy.forward(scope, viewer.receive, viewer.send, address), 5)
        await asyncio.wait_for(app_closed.wait(), 5)  # the app's connection was closed
        assert viewer.messages[0]["status"] == 200
        assert viewer.body().count(b"data: tick") >= 3

    asyncio.run(with_app(scenario))


def test_a_streamed_response_arrives_whole_while_the_viewer_stays():
    async def scenario(proxy, address, app_closed):
        viewer = Viewer()
        scope = {**SCOPE, "path": "/chunked", "raw_path": b"/chunked"}
        await asyncio.wait_for(proxy.forward(scope, viewer.receive, viewer.send, address), 5)
        assert viewer.messages[0]["status"] == 200
        assert viewer.body() == b"x" * 1_000_000
        assert viewer.messages[-1] == {"type": "http.response.body", "body": b""}

    asyncio.run(with_app(scenario))
