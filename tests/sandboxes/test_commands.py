"""Operator commands, against a real sandbox."""

import io
import tarfile

import pytest
from django.core.management import CommandError, call_command

from sandboxes.backends.docker import DockerBackend
from sandboxes.models import Sandbox
from tests import factories

pytestmark = [pytest.mark.docker, pytest.mark.django_db]


def test_sandbox_ensure_status_and_destroy(owner, egress_proxy, clean_runtimes, capsys):
    call_command("sandbox_ensure", owner.email)
    sandbox = Sandbox.objects.get(user=owner)
    assert capsys.readouterr().out.strip() == f"{sandbox.pk} running"

    call_command("sandbox_status", owner.email)
    assert f"{owner.email}  {sandbox.pk}  running" in capsys.readouterr().out

    call_command("sandbox_destroy", owner.email)
    assert capsys.readouterr().out.strip() == f"{sandbox.pk} absent"
    assert DockerBackend().list_instances() == []


def test_sandbox_status_reports_a_container_removed_behind_quors_back(
    running_sandbox, owner, docker_client, capsys
):
    docker_client.containers.get(DockerBackend().container_name(str(running_sandbox.pk))).remove(
        force=True
    )
    call_command("sandbox_status")
    assert "absent" in capsys.readouterr().out


def test_sandbox_exec_prints_output_and_exits_with_the_commands_code(running_sandbox, owner, capfd):
    with pytest.raises(SystemExit) as excinfo:
        call_command(
            "sandbox_exec", owner.email, "--", "sh", "-c", "echo out; echo err >&2; exit 7"
        )
    assert excinfo.value.code == 7
    out, err = capfd.readouterr()
    assert out == "out\n"
    assert "err" in err


def test_sandbox_exec_runs_in_a_sessions_workspace(running_sandbox, owner, capfd):
    session = factories.make_session(owner)
    with pytest.raises(SystemExit) as excinfo:
        call_command("sandbox_exec", owner.email, "--session", str(session.pk), "--", "pwd")
    assert excinfo.value.code == 0
    assert capfd.readouterr().out == f"/workspace/sessions/{session.pk}\n"


def test_sandbox_exec_refuses_another_users_session(running_sandbox, owner, colleague):
    session = factories.make_session(colleague)
    with pytest.raises(CommandError, match="has no session"):
        call_command("sandbox_exec", owner.email, "--session", str(session.pk), "--", "true")


def test_the_workspace_streams_out_and_back_in(running_sandbox, owner):
    from sandboxes.runtime import services

    services.sandbox_exec(user=owner, argv=["sh", "-c", "echo precious > /workspace/keep.txt"])
    backend = DockerBackend()
    archive = b"".join(backend.export_workspace(str(running_sandbox.pk)))
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        names = tar.getnames()
    assert "./keep.txt" in names
    services.sandbox_exec(user=owner, argv=["rm", "/workspace/keep.txt"])
    backend.import_workspace(str(running_sandbox.pk), [archive])
    assert (
        services.sandbox_exec(user=owner, argv=["cat", "/workspace/keep.txt"]).stdout
        == b"precious\n"
    )


@pytest.mark.parametrize(
    ("environment", "cap_add", "message"),
    [
        (
            {"QUOR_PROXY_PORT": "8899", "QUOR_CONTROL_PLANE_ADDR": "10.0.0.1"},
            None,
            "QUOR_PROXY_HOST is not set",
        ),
        (None, ["NET_ADMIN", "SETUID", "SETGID"], "missing capabilities: SETPCAP"),
    ],
)
def test_the_entrypoint_refuses_to_start_without_its_firewall(
    docker_client, environment, cap_add, message
):
    from django.conf import settings

    environment = environment or {
        "QUOR_PROXY_HOST": "10.0.0.1",
        "QUOR_PROXY_PORT": "8899",
        "QUOR_CONTROL_PLANE_ADDR": "10.0.0.1",
    }
    output = None
    with pytest.raises(Exception) as excinfo:
        output = docker_client.containers.run(
            settings.QUOR_SANDBOX_IMAGE,
            environment=environment,
            cap_drop=["ALL"],
            cap_add=cap_add or ["NET_ADMIN", "SETUID", "SETGID", "SETPCAP"],
            security_opt=["no-new-privileges"],
            network_mode="none",
            remove=True,
            stderr=True,
        )
    assert output is None
    assert message in str(excinfo.value)
