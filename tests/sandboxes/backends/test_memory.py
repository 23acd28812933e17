"""The in-memory backend beyond the contract: refused outside development, what tests
drive it with, and service code running on it without Docker."""

import pytest
from django.test import override_settings

from quor.checks import check_sandbox_backend
from sandboxes.backends import get_backend
from sandboxes.backends.base import BackendError, BackendUnavailable, RuntimeMissing
from sandboxes.backends.memory import MemoryBackend
from sandboxes.image import WORKSPACE
from sandboxes.models import Sandbox
from sandboxes.runtime import services
from tests.sandboxes.backends.conftest import new_spec


@pytest.fixture
def memory():
    yield MemoryBackend()
    MemoryBackend.reset()


@pytest.mark.parametrize(
    ("backend", "debug", "expected"),
    [("memory", False, ["quor.E006"]), ("memory", True, []), ("docker", False, [])],
)
def test_start_up_refuses_the_memory_backend_outside_development(backend, debug, expected):
    with override_settings(QUOR_SANDBOX_BACKEND=backend, DEBUG=debug):
        assert [error.id for error in check_sandbox_backend(None)] == expected


@override_settings(DEBUG=True)
def test_the_memory_backend_is_registered_as_memory():
    assert isinstance(get_backend("memory"), MemoryBackend)


def test_no_process_gets_the_memory_backend_outside_development():
    with pytest.raises(BackendError, match="for tests only"):
        get_backend("memory")


def test_a_backend_made_while_its_engine_is_unreachable_fails_at_once(monkeypatch):
    with pytest.raises(BackendUnavailable):
        MemoryBackend(unreachable=True)
    monkeypatch.setattr(MemoryBackend, "unreachable", True)
    with pytest.raises(BackendUnavailable):
        MemoryBackend()


def test_the_engine_comes_back_with_the_sandboxes_it_had(memory, monkeypatch):
    spec = new_spec()
    memory.ensure(spec)
    monkeypatch.setattr(MemoryBackend, "unreachable", True)
    with pytest.raises(BackendUnavailable):
        memory.status(spec.sandbox_id)
    monkeypatch.setattr(MemoryBackend, "unreachable", False)
    assert memory.status(spec.sandbox_id).running


def test_sandboxes_have_workspaces_and_addresses_of_their_own(memory):
    first, second = new_spec(), new_spec()
    address_of = {spec.sandbox_id: memory.ensure(spec).network_address for spec in (first, second)}
    assert len(set(address_of.values())) == 2
    memory.write_file(first.sandbox_id, WORKSPACE, "mine.txt", [b"first"], 5)
    assert [e["name"] for e in memory.list_files(second.sandbox_id, WORKSPACE, "")] == ["sessions"]


def test_a_path_inside_a_longer_argument_is_not_mapped(memory):
    spec = new_spec()
    memory.ensure(spec)
    result = memory.exec(
        spec.sandbox_id, ["echo", "/workspace/x", "see /workspace/x"],
        cwd=WORKSPACE, env={}, timeout_s=10, output_limit=1000,
    )  # fmt: skip
    mapped, _, kept = result.stdout.decode().strip().partition(" see ")
    assert mapped.endswith("/x") and mapped != "/workspace/x"
    assert kept == "/workspace/x"


def test_a_missing_program_exits_127_like_a_shell_says(memory):
    spec = new_spec()
    memory.ensure(spec)
    result = memory.exec(
        spec.sandbox_id, ["no-such-program"], cwd=WORKSPACE, env={}, timeout_s=10,
        output_limit=1000,
    )  # fmt: skip
    assert result.exit_code == 127
    with pytest.raises(BackendError, match="exit 127"):
        list(memory.exec_stream(spec.sandbox_id, ["no-such-program"], cwd=WORKSPACE))


@pytest.mark.django_db
@override_settings(QUOR_SANDBOX_BACKEND="memory", DEBUG=True)
def test_service_code_runs_on_the_memory_backend_without_docker(owner, memory):
    sandbox = services.sandbox_ensure(user=owner)
    assert (sandbox.backend, sandbox.state) == ("memory", Sandbox.State.RUNNING)
    assert sandbox.network_address == memory.status(str(sandbox.pk)).network_address
    result = services.sandbox_exec(user=owner, argv=["sh", "-c", "echo hi > note.txt"])
    assert result.exit_code == 0, result.stderr
    assert services.sandbox_exec(user=owner, argv=["cat", "/workspace/note.txt"]).stdout == b"hi\n"
    MemoryBackend.lose_runtime(str(sandbox.pk))
    assert services.sandbox_refresh_state(sandbox).state == Sandbox.State.ABSENT
    with pytest.raises(RuntimeMissing):
        memory.exec(str(sandbox.pk), ["true"], cwd=WORKSPACE, env={}, timeout_s=5, output_limit=9)
