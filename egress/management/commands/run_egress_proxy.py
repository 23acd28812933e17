import time

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import connections
from proxy import Proxy

from egress import ca, readiness
from egress.directory import ContextLoader
from egress.proxy_plugin import (
    cap_request_bodies,
    read_request_targets,
    reuse_upstream_tls_contexts,
    serve_intercepted_tls_from_cache,
)
from quor.lib import metrics
from sandboxes.backends import get_backend


class Command(BaseCommand):
    help = (
        "Run the egress proxy on the sandbox network's host address. It reports ready "
        "(see egress_ready) once it has loaded the current sandboxes."
    )

    def add_arguments(self, parser):
        parser.add_argument("--acceptors", type=int, default=2)

    def handle(self, *args, acceptors, **options):
        files = ca.ensure_ca(settings.QUOR_EGRESS_CA_DIR)
        trust = ca.write_upstream_trust(files, settings.QUOR_EXTRA_CA_BUNDLE)
        host = get_backend().egress_proxy_listen_address()
        port = settings.QUOR_EGRESS_PROXY_PORT
        cap_request_bodies(settings.QUOR_EGRESS_MAX_BODY_BYTES)
        read_request_targets()
        reuse_upstream_tls_contexts()
        serve_intercepted_tls_from_cache(files)
        argv = [
            "--hostname", host,
            "--port", str(port),
            "--threaded",
            "--num-acceptors", str(acceptors),
            "--timeout", str(settings.QUOR_EGRESS_IDLE_TIMEOUT),
            "--plugins", "egress.proxy_plugin.QuorEgressPlugin",
            "--work-klass", "egress.proxy_plugin.EgressProtocolHandler",
            "--disable-headers", "via",  # upstreams need not learn the proxy's software
            "--ca-key-file", str(files.key),
            "--ca-cert-file", str(files.cert),
            "--ca-signing-key-file", str(files.signing_key),
            "--ca-cert-dir", str(files.leaf_dir),
            "--ca-file", str(trust),
            "--log-level", "ERROR",
        ]  # fmt: skip
        if settings.QUOR_METRICS_PORT:  # decisions are counted in the acceptor processes
            metrics.serve_multiprocess(settings.QUOR_METRICS_PORT)
        connections.close_all()  # acceptor processes fork: they must not share a connection
        loader = ContextLoader()  # keeps the Apps between loads, as each acceptor's directory
        with Proxy(argv):
            self.stdout.write(f"Egress proxy listening on {host}:{port}", ending="\n")
            self.stdout.flush()
            while True:
                try:
                    count = len(loader.load())
                    readiness.publish_ready(sandboxes=count, listen=f"{host}:{port}")
                except Exception as exc:  # not ready while the database or Redis is down
                    self.stderr.write(f"egress proxy not ready: {exc}")
                finally:
                    connections.close_all()
                time.sleep(2)
