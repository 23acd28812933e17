import uvicorn
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from webapps.proxy import WebAppProxy, app_hosts_only


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
        "QUOR_WEBAPP_PROXY_BIND, with uvicorn: the web app proxy and nothing else (any "
        "other host gets 404). A slow viewer slows the read from the app: memory stays "
        "bounded."
    )

    def add_arguments(self, parser):
        parser.add_argument("--bind", help="host:port (default: QUOR_WEBAPP_PROXY_BIND)")
        parser.add_argument("--access-log", action="store_true", help="log every request")

    def handle(self, *args, bind, access_log, **options):
        host, port = parse_bind(bind or settings.QUOR_WEBAPP_PROXY_BIND)
        config = uvicorn.Config(
            app_hosts_only(WebAppProxy()),
            host=host,
            port=port,
            http="httptools",
            ws="websockets-sansio",
            lifespan="on",
            # The app's own Server and Date headers pass through; none are added.
            server_header=False,
            date_header=False,
            # X-Forwarded-* from viewers mean nothing here (and never reach the app).
            proxy_headers=False,
            access_log=access_log,
            log_config=None,  # Django's LOGGING
            log_level="info",
        )
        self.stdout.write(f"Web app proxy listening on {host}:{port}", ending="\n")
        self.stdout.flush()
        uvicorn.Server(config).run()
