import asyncio
import signal

import uvloop
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from quor.lib import metrics
from webapps.proxy import WebAppProxy, serve


def parse_bind(bind: str) -> tuple[str, int]:
    """`host:port` or `[ipv6]:port`."""
    host, _, port = bind.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise CommandError(f"QUOR_WEBAPP_PROXY_BIND must be host:port, not {bind!r}")
    return host, int(port)


class Command(BaseCommand):
    help = (
        "Serve web apps on their own hosts (`<label>.<host of QUOR_WEBAPP_BASE_URL>`) on "
        "QUOR_WEBAPP_PROXY_BIND: the web app proxy and nothing else (any other host gets "
        "404). A slow viewer slows the read from the app: memory stays bounded. Stops on "
        "SIGTERM or SIGINT."
    )

    def add_arguments(self, parser):
        parser.add_argument("--bind", help="host:port (default: QUOR_WEBAPP_PROXY_BIND)")
        parser.add_argument("--access-log", action="store_true", help="log every request")

    def handle(self, *args, bind, access_log, **options):
        host, port = parse_bind(bind or settings.QUOR_WEBAPP_PROXY_BIND)
        if settings.QUOR_METRICS_PORT:
            metrics.serve(settings.QUOR_METRICS_PORT)
        uvloop.run(self.serve(WebAppProxy(access_log=access_log), host, port))

    async def serve(self, proxy: WebAppProxy, host: str, port: int):
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        server = await serve(proxy, host, port)
        proxy.start()
        self.stdout.write(f"Web app proxy listening on {host}:{port}", ending="\n")
        self.stdout.flush()
        async with server:
            await stop.wait()
        proxy.close()
