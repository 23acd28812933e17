"""The Docker backend against the real Docker Engine: lifecycle, hardening, exec."""

import contextlib
import gc
import io
import socket
import tarfile
import threading

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connection
from django.test import override_settings

from quor.checks import check_docker_host_users
from sandboxes.backends import docker as docker_backend
from sandboxes.backends.base import BackendError
from sandboxes.backends.docker import DockerBackend
from sandboxes.backends.execution import STDOUT
from sandboxes.models import Sandbox
from sandboxes.runtime import services
from tests import environment
from tests.docker_helpers import container_of

pytestmark = [pytest.mark.docker, pytest.mark.django_db]


def run(user, argv, **kwargs):
    return services.sandbox_exec(user=user, argv=argv, **kwargs)


def test_ensure_starts_one_labelled_container_and_records_it(running_sandbox, docker_client):
    assert running_sandbox.state == Sandbox.State.RUNNING
    container = container_of(docker_client, running_sandbox)
    assert running_sandbox.runtime_id == container.id
    assert running_sandbox.image_ref == container.attrs["Image"]
    assert running_sandbox.image_ref.startswith("sha256:")
    assert container.labels["org.quor.sandbox-id"] == str(running_sandbox.pk)
    assert container.labels["org.quor.deployment"] == settings.QUOR_DEPLOYMENT


def test_the_container_is_hardened(running_sandbox, docker_client):
    host_config = container_of(docker_client, running_sandbox).attrs["HostConfig"]
    assert host_config["Privileged"] is False
    assert host_config["CapDrop"] == ["ALL"]
    assert sorted(host_config["CapAdd"]) == ["NET_ADMIN", "SETGID", "SETPCAP", "SETUID"]
    assert host_config["SecurityOpt"] == ["no-new-privileges"]
    assert host_config["ReadonlyRootfs"] is True
    assert host_config["NanoCpus"] == 1_000_000_000
    assert host_config["Memory"] == 2048 * 1024 * 1024
    assert host_config["PidsLimit"] == 512
    assert not host_config.get("Binds")
    assert [m["Type"] for m in host_config["Mounts"]] == ["volume"]
    assert host_config["NetworkMode"] == DockerBackend().network_name


def test_commands_run_as_the_sandbox_user_without_capabilities(running_sandbox, owner):
    assert run(owner, ["id", "-u"]).stdout == b"1000\n"
    status = run(owner, ["cat", "/proc/self/status"]).stdout.decode()
    caps = dict(line.split(":\t") for line in status.splitlines() if line.startswith("Cap"))
    for name in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
        assert int(caps[name], 16) == 0, name
    assert "NoNewPrivs:\t1" in status


def test_the_root_filesystem_is_read_only_and_the_workspace_writable(running_sandbox, owner):
    assert run(owner, ["touch", "/usr/local/bin/evil"]).exit_code != 0
    assert run(owner, ["touch", "/workspace/ok", "/tmp/ok", "/home/sandbox/ok"]).exit_code == 0
    assert run(owner, ["test", "-S", "/var/run/docker.sock"]).exit_code != 0


def test_the_sandbox_user_cannot_change_the_firewall(running_sandbox, owner):
    assert run(owner, ["iptables", "-F"]).exit_code != 0
    assert run(owner, ["iptables", "-P", "OUTPUT", "ACCEPT"]).exit_code != 0
    assert run(owner, ["touch", "/run/quor/firewall-ready"]).exit_code != 0


def test_exec_takes_argv_without_a_shell(running_sandbox, owner):
    result = run(owner, ["echo", "$HOME; touch /workspace/pwned"])
    assert result.stdout == b"$HOME; touch /workspace/pwned\n"
    assert run(owner, ["test", "-e", "/workspace/pwned"]).exit_code == 1


def test_exec_reports_exit_code_stderr_and_duration(running_sandbox, owner):
    result = run(owner, ["python3", "-c", "import sys; sys.stderr.write('oops'); sys.exit(3)"])
    assert result.exit_code == 3
    assert result.stderr == b"oops"
    assert not result.timed_out
    assert 0 < result.duration_s < 10


@override_settings(QUOR_EXEC_OUTPUT_LIMIT=1000)
def test_exec_output_is_bounded_per_stream_and_says_so(running_sandbox, owner):
    code = "import sys; sys.stdout.write('o' * 500000); sys.stderr.write('e' * 10)"
    result = run(owner, ["python3", "-c", code])
    assert result.stdout == b"o" * 1000
    assert result.stdout_truncated is True
    assert result.stderr == b"e" * 10
    assert result.stderr_truncated is False
    assert result.exit_code == 0


def test_a_command_past_its_timeout_is_killed_with_its_children(running_sandbox, owner):
    result = run(owner, ["sh", "-c", "sleep 60 & sleep 60"], timeout_s=1)
    assert result.timed_out is True
    assert result.duration_s < 6
    leftovers = run(owner, ["pgrep", "-f", "^sleep 60"])
    assert leftovers.exit_code == 1, leftovers.stdout


def test_ensure_is_idempotent(running_sandbox, owner, docker_client):
    again = services.sandbox_ensure(user=owner)
    assert again.runtime_id == running_sandbox.runtime_id
    assert len(DockerBackend().list_instances()) == 1


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_ensures_produce_one_container(owner, egress_proxy, clean_runtimes):
    results, errors = [], []
    barrier = threading.Barrier(2)

    def ensure():
        try:
            barrier.wait()
            results.append(services.sandbox_ensure(user=owner).runtime_id)
        except Exception as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=ensure) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(set(results)) == 1
    assert len(DockerBackend().list_instances()) == 1
    assert Sandbox.objects.count() == 1


def test_a_container_removed_behind_quors_back_is_detected_and_recreated(
    running_sandbox, owner, docker_client
):
    container_of(docker_client, running_sandbox).remove(force=True)
    refreshed = services.sandbox_refresh_state(Sandbox.objects.get(pk=running_sandbox.pk))
    assert refreshed.state == Sandbox.State.ABSENT
    recreated = services.sandbox_ensure(user=owner)
    assert recreated.state == Sandbox.State.RUNNING
    assert recreated.runtime_id != running_sandbox.runtime_id
    assert run(owner, ["true"]).exit_code == 0


def test_ensure_recreates_a_container_that_vanished_while_marked_running(
    running_sandbox, owner, docker_client
):
    container_of(docker_client, running_sandbox).remove(force=True)
    assert Sandbox.objects.get(pk=running_sandbox.pk).state == Sandbox.State.RUNNING
    assert run(owner, ["true"]).exit_code == 0
    assert Sandbox.objects.get(pk=running_sandbox.pk).runtime_id != running_sandbox.runtime_id


def test_the_workspace_survives_stop_and_start(running_sandbox, owner):
    run(owner, ["sh", "-c", "echo kept > /workspace/note.txt"])
    services.sandbox_stop(sandbox=running_sandbox)
    assert Sandbox.objects.get(pk=running_sandbox.pk).state == Sandbox.State.STOPPED
    assert run(owner, ["cat", "/workspace/note.txt"]).stdout == b"kept\n"


def test_destroy_leaves_nothing_behind(running_sandbox, docker_client):
    backend = DockerBackend()
    sandbox_id = str(running_sandbox.pk)
    services.sandbox_destroy(sandbox=running_sandbox)
    assert Sandbox.objects.get(pk=running_sandbox.pk).state == Sandbox.State.ABSENT
    assert backend.list_instances() == []
    assert not docker_client.volumes.list(filters={"name": backend.volume_name(sandbox_id)})
    network = docker_client.networks.get(backend.network_name)
    assert network.attrs["Containers"] == {}


def test_destroy_can_keep_the_workspace(running_sandbox, owner, docker_client):
    run(owner, ["sh", "-c", "echo kept > /workspace/note.txt"])
    services.sandbox_destroy(sandbox=running_sandbox, remove_workspace=False)
    assert run(owner, ["cat", "/workspace/note.txt"]).stdout == b"kept\n"


def test_a_missing_image_fails_the_sandbox_with_a_clear_reason(owner, egress_proxy, clean_runtimes):
    with (
        override_settings(QUOR_SANDBOX_IMAGE="quor-sandbox:does-not-exist"),
        pytest.raises(services.SandboxUnavailable, match="make sandbox-image"),
    ):
        services.sandbox_ensure(user=owner)
    sandbox = Sandbox.objects.get(user=owner)
    assert sandbox.state == Sandbox.State.FAILED
    assert "make sandbox-image" in sandbox.failure_reason


def test_programs_can_run_from_tmp_and_home_for_virtualenvs(running_sandbox, owner):
    for place in ("/tmp/venv", "/home/sandbox/venv"):
        made = run(
            owner, ["sh", "-c", f"python3 -m venv {place} && {place}/bin/python -c 'print(42)'"]
        )
        assert made.stdout == b"42\n", made.stderr


def test_a_new_image_replaces_an_idle_runtime_and_keeps_the_workspace(
    running_sandbox, owner, docker_client
):
    run(owner, ["sh", "-c", "echo kept > /workspace/note.txt"])
    image = docker_client.images.get("quor-sandbox:latest")
    tag = f"upgrade-test-{environment.NAME}"  # this worker's own
    image.tag("quor-sandbox", tag)
    try:
        with override_settings(QUOR_SANDBOX_IMAGE=f"quor-sandbox:{tag}"):
            assert services.sandbox_ensure(user=owner).runtime_id == running_sandbox.runtime_id
            container_of(docker_client, running_sandbox).commit("quor-sandbox", tag)
            upgraded = services.sandbox_ensure(user=owner)
        assert upgraded.runtime_id != running_sandbox.runtime_id
        assert upgraded.image_ref == docker_client.images.get(f"quor-sandbox:{tag}").id
        assert run(owner, ["cat", "/workspace/note.txt"]).stdout == b"kept\n"
    finally:
        services.sandbox_destroy(sandbox=Sandbox.objects.get(user=owner))
        docker_client.images.remove(f"quor-sandbox:{tag}", force=True)


def test_an_archive_tar_refuses_is_a_backend_error_with_tars_message(running_sandbox, owner):
    with pytest.raises(
        BackendError, match=r"tar in the sandbox failed.*does not look like a tar archive"
    ):
        DockerBackend().import_workspace(str(running_sandbox.pk), [b"not a tar archive\n" * 2000])


def connect_with_a_wrong_token(sandbox, script, *args, sending=b""):
    """Starts `script` as the backend does and connects as an intruder would; returns what
    the intruder received, the script's exit code and its stderr."""
    backend = DockerBackend()
    container = backend._container(str(sandbox.pk))
    argv = ["python3", "-c", script, "a" * 32, *args]
    execution = backend._runtime_starter(container.id)(argv, cwd="/workspace", env={}, stdin=False)
    output = {1: bytearray(), 2: bytearray()}
    received = bytearray()
    try:
        frames = execution.output(30)
        port = int(docker_backend._first_line(frames, output))
        address = backend.status(str(sandbox.pk)).network_address
        with socket.create_connection((address, port), timeout=10) as intruder:
            intruder.sendall(b"b" * 32 + sending)
            with contextlib.suppress(ConnectionResetError):  # closed with bytes unread
                while piece := intruder.recv(65536):
                    received.extend(piece)
        for stream_id, data in frames:
            output[stream_id].extend(data)
    finally:
        execution.close()
    return bytes(received), execution.exit_code(), bytes(output[2])


def test_the_unpack_receiver_takes_no_connection_without_its_token(running_sandbox, owner):
    """What reaches the receiver's port first is the host (the sandbox's firewall accepts
    nothing else); even so, bytes without the token are never unpacked."""
    _, exit_code, stderr = connect_with_a_wrong_token(
        running_sandbox, docker_backend.RECEIVE_AND_UNPACK, "/workspace",
        sending=tar_of("planted.txt", b"planted"),
    )  # fmt: skip
    assert exit_code != 0
    assert b"without the token" in stderr
    assert run(owner, ["test", "-e", "/workspace/planted.txt"]).exit_code == 1


def test_the_snapshot_sender_gives_nothing_to_a_connection_without_its_token(
    running_sandbox, owner
):
    assert run(owner, ["sh", "-c", "echo private > /workspace/private.txt"]).exit_code == 0
    received, exit_code, stderr = connect_with_a_wrong_token(
        running_sandbox, docker_backend.SEND_ARCHIVE, "/workspace", ".quor-managed"
    )
    assert received == b""
    assert exit_code != 0
    assert b"without the token" in stderr


def tar_of(name: str, content: bytes) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(content)
        tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


@pytest.fixture
def engine_without_user_namespaces(monkeypatch):
    """The real engine, reporting what an engine without userns-remap reports."""
    import docker

    real = docker.from_env().info()
    options = [o for o in real["SecurityOptions"] if not o.startswith("name=userns")]
    monkeypatch.setattr(
        docker.DockerClient, "info", lambda self: {**real, "SecurityOptions": options}
    )


def test_the_engine_here_maps_sandbox_users_to_other_host_ids():
    real = DockerBackend().client.info()
    assert docker_backend.remaps_user_ids(real)
    DockerBackend().check_host_users()
    assert check_docker_host_users(None) == []


def test_an_engine_that_keeps_the_hosts_user_ids_gets_no_sandbox(
    owner, egress_proxy, clean_runtimes, engine_without_user_namespaces
):
    with pytest.raises(services.SandboxUnavailable, match="host's own user ids"):
        services.sandbox_ensure(user=owner)
    assert Sandbox.objects.get(user=owner).state == Sandbox.State.FAILED
    backend = DockerBackend()
    assert backend.list_instances() == [] and backend.list_workspaces() == []
    with pytest.raises(SystemCheckError, match=r"quor\.E010.*userns-remap"):
        call_command("check")


def test_a_docker_exec_socket_outlives_the_backend_that_started_it(running_sandbox):
    """docker-py's file object around the socket `docker exec` hijacks holds the HTTP
    response the socket belongs to. Dropped while the socket was still read, that response
    was collected with the backend (when the collector ran) and its connection closed the
    socket: a wake's transfer failed with EBADF now and then."""

    def start(number):
        backend = DockerBackend()  # one per operation, as Quor makes them
        return backend._runtime_starter(backend.container_name(running_sandbox.backend_sandbox_id))(
            ["sh", "-c", f"sleep 1; echo {number}"], cwd="/", env={}, stdin=False
        )

    executions = [start(number) for number in range(8)]
    gc.collect()
    for number, execution in enumerate(executions):
        output = b"".join(data for stream, data in execution.output(10) if stream == STDOUT)
        execution.close()
        assert output == f"{number}\n".encode()
