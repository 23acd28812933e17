"""The warm pool: ready runtimes made ahead of demand, which a sandbox takes instead of
creating one (its first runtime, or a fresh one to wake into from a snapshot).

Every runtime, pooled or not, is made from `runtime_spec`, which holds nothing of any
user: the sandbox's identity and placeholders travel with each command instead
(services.sandbox_identity_environment). A pooled runtime is never given back: a
sandbox that takes one keeps it under its key until it is destroyed. A ready runtime
not taken within QUOR_SANDBOX_POOL_MAX_AGE_SECONDS, or of an image that is no longer
the current one, is recycled.

Rows first, side effects after: a runtime is created only once its row says so, and
its row is gone before it is destroyed. What a crash leaves (a row still "creating", a
runtime with no row) is removed by the next refill or by reconciliation.
"""

import contextlib
import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from egress.ca import ensure_ca
from egress.decisions import API_ALIAS
from quor.lib.locks import advisory_try_lock
from quor.lib.tasks import send_on_commit
from sandboxes.backends import get_backend
from sandboxes.backends.base import BackendError, RuntimeStatus, SandboxBackend, SandboxSpec
from sandboxes.models import PooledRuntime, Sandbox

logger = logging.getLogger(__name__)


def runtime_environment() -> dict[str, str]:
    """The runtime's own environment: the same for every sandbox."""
    return {
        "QUOR_API_URL": f"http://{API_ALIAS[0]}",
        "QUOR_EGRESS_CA_CERT": ensure_ca(settings.QUOR_EGRESS_CA_DIR).cert_pem(),
    }


def runtime_spec(backend_sandbox_id: str) -> SandboxSpec:
    return SandboxSpec(
        sandbox_id=backend_sandbox_id,
        image=settings.QUOR_SANDBOX_IMAGE,
        cpus=settings.QUOR_SANDBOX_CPUS,
        memory_bytes=settings.QUOR_SANDBOX_MEMORY_MB * 1024 * 1024,
        pids_limit=settings.QUOR_SANDBOX_PIDS,
        environment=runtime_environment(),
    )


def pool_take(sandbox: Sandbox, backend: SandboxBackend) -> RuntimeStatus | None:
    """A ready runtime of the current image for `sandbox`, which from now on goes by its
    key; None if the pool has none. The caller holds the sandbox's lock and keeps
    nothing under the sandbox's current key (no workspace, or one a wake replaces):
    whatever is there is removed before the take."""
    current = backend.image_ref(settings.QUOR_SANDBOX_IMAGE)
    if not current:
        return None
    takeable = PooledRuntime.objects.filter(
        backend=backend.name,
        state=PooledRuntime.State.READY,
        image_ref=current,
        created_at__gte=_oldest_allowed(),
    )
    if not takeable.exists():
        return None
    # A runtime a failed or half-done start left under the sandbox's own key goes first.
    backend.destroy(sandbox.backend_sandbox_id, remove_workspace=True)
    while True:
        with transaction.atomic():
            entry = takeable.select_for_update(skip_locked=True).first()
            if entry is None:
                return None
            key = entry.key
            entry.delete()
            Sandbox.objects.filter(pk=sandbox.pk).update(runtime_key=key)
            send_on_commit("sandboxes.tasks.refill_pool")
        sandbox.runtime_key = key
        status = backend.status(key)
        if status.running:
            return status
        logger.warning("pooled runtime %s was %s when taken: removed", key, status.detail)
        with contextlib.suppress(BackendError):
            backend.destroy(key, remove_workspace=True)


def pools_refill() -> int:
    """The configured backend's pool refilled first; then any other backend's (the
    deployment moved) emptied, each on its own: one that cannot be reached is logged and
    tried again next time."""
    created = pool_refill(settings.QUOR_SANDBOX_BACKEND)
    left = PooledRuntime.objects.exclude(backend=settings.QUOR_SANDBOX_BACKEND)
    for name in sorted(set(left.values_list("backend", flat=True))):
        try:
            pool_refill(name)
        except BackendError as exc:
            logger.warning("the %s pool the deployment left was not emptied: %s", name, exc)
    return created


def pool_refill(backend_name: str | None = None) -> int:
    """Recycles what may no longer be taken (too old, another image, no longer running,
    above QUOR_SANDBOX_POOL_SIZE), then creates ready runtimes up to it; returns how many
    it created. One process at a time per backend (the others return at once); safe to
    run twice."""
    backend = get_backend(backend_name)
    size = settings.QUOR_SANDBOX_POOL_SIZE if backend.name == settings.QUOR_SANDBOX_BACKEND else 0
    with advisory_try_lock(f"quor-pool:{backend.name}") as locked:
        if not locked:
            return 0
        pool = PooledRuntime.objects.filter(backend=backend.name)
        running = {i.sandbox_id for i in backend.list_instances() if i.running}
        ready = pool.filter(state=PooledRuntime.State.READY).values_list("key", flat=True)
        _remove(
            backend,
            {
                *pool.filter(_stale(backend)).values_list("key", flat=True),
                *pool.filter(state=PooledRuntime.State.CREATING).values_list("key", flat=True),
                *(key for key in ready if key not in running),
                *pool.order_by("-created_at")[size:].values_list("key", flat=True),
            },
        )
        created = 0
        while pool.count() < size:
            entry = PooledRuntime.objects.create(backend=backend.name)
            try:
                status = backend.ensure(runtime_spec(entry.key))
            except BackendError as exc:
                logger.warning("the warm pool could not create a runtime: %s", exc)
                _remove(backend, [entry.key])
                break
            pool.filter(pk=entry.pk).update(
                state=PooledRuntime.State.READY,
                image_ref=status.image_ref,
                runtime_id=status.runtime_id,
                network_address=status.network_address or None,
                ready_at=timezone.now(),
            )
            created += 1
        return created


def _oldest_allowed():
    return timezone.now() - timedelta(seconds=settings.QUOR_SANDBOX_POOL_MAX_AGE_SECONDS)


def _stale(backend: SandboxBackend) -> Q:
    """Made longer than QUOR_SANDBOX_POOL_MAX_AGE_SECONDS ago, or of another image than
    the current one: an upgrade drains the pool."""
    current = backend.image_ref(settings.QUOR_SANDBOX_IMAGE)
    return Q(state=PooledRuntime.State.READY) & (
        Q(created_at__lt=_oldest_allowed()) | ~Q(image_ref=current)
    )


def _remove(backend: SandboxBackend, keys) -> None:
    """Row first (from then on nobody takes it), runtime and workspace after; a key a
    sandbox took meanwhile is left alone."""
    for key in keys:
        if PooledRuntime.objects.filter(pk=key).delete()[0]:
            with contextlib.suppress(BackendError):
                backend.destroy(key, remove_workspace=True)
