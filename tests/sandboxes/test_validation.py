"""Input checks that refuse bad requests before anything reaches a container."""

import pytest
from django.test import override_settings

from quor.lib.errors import InvalidInput
from sandboxes.backends.base import SandboxSpec, UnsafeSandboxSpec, validate_spec
from sandboxes.models import Sandbox
from sandboxes.runtime.services import clean_relative_path, validate_exec_request

WS = "/workspace/sessions/abc"


def test_exec_takes_argv_and_resolves_cwd_inside_the_workspace():
    request = validate_exec_request(argv=["ls", "-la"], cwd="src/app", workspace=WS)
    assert request.argv == ["ls", "-la"]
    assert request.cwd == f"{WS}/src/app"
    assert validate_exec_request(argv=["true"], workspace=WS).cwd == WS


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"argv": "ls -la"}, "exec.invalid_argv"),
        ({"argv": []}, "exec.invalid_argv"),
        ({"argv": ["ls", 3]}, "exec.invalid_argv"),
        ({"argv": ["ls", "a\x00b"]}, "exec.invalid_argv"),
        ({"argv": ["ls"], "cwd": "../other-session"}, "exec.invalid_cwd"),
        ({"argv": ["ls"], "cwd": "/etc"}, "exec.invalid_cwd"),
        ({"argv": ["ls"], "cwd": "a/../../.."}, "exec.invalid_cwd"),
        ({"argv": ["ls"], "env": {"OPENAI_API_KEY": "x"}}, "exec.secret_in_env"),
        (
            {"argv": ["ls"], "env": {"GH": "ghp_abcdefghijklmnopqrstuvwxyz0123456789"}},
            "exec.secret_in_env",
        ),
        ({"argv": ["ls"], "env": {"X": "-----BEGIN RSA PRIVATE KEY-----"}}, "exec.secret_in_env"),
        ({"argv": ["ls"], "env": {"MY_TOKEN": "abc"}}, "exec.secret_in_env"),
        ({"argv": ["ls"], "env": {"1BAD": "x"}}, "exec.invalid_env"),
        ({"argv": ["ls"], "env": ["A=1"]}, "exec.invalid_env"),
        ({"argv": ["ls"], "timeout_s": 0}, "exec.invalid_timeout"),
        ({"argv": ["ls"], "timeout_s": 10**6}, "exec.invalid_timeout"),
    ],
)
def test_bad_exec_requests_are_refused_with_a_code(kwargs, code):
    with pytest.raises(InvalidInput) as excinfo:
        validate_exec_request(workspace=WS, **kwargs)
    assert excinfo.value.code == code


def test_ordinary_environment_values_pass():
    request = validate_exec_request(
        argv=["env"], env={"LANG": "C.UTF-8", "DEBUG": "1"}, workspace=WS
    )
    assert request.env == {"LANG": "C.UTF-8", "DEBUG": "1"}


@pytest.mark.parametrize("path", ["..", "a/../../b", "/etc/passwd", "a\x00b", 7])
def test_paths_that_could_leave_the_workspace_are_refused(path):
    with pytest.raises(InvalidInput) as excinfo:
        clean_relative_path(path)
    assert excinfo.value.code == "files.invalid_path"


def test_relative_paths_are_normalised():
    assert clean_relative_path("./src//main.py") == "src/main.py"
    assert clean_relative_path("") == ""


SAFE = {"sandbox_id": "x", "image": "i", "cpus": 1.0, "memory_bytes": 1 << 30, "pids_limit": 100}


@pytest.mark.parametrize(
    ("unsafe", "problem"),
    [
        ({"privileged": True}, "privileged"),
        ({"extra_capabilities": ("SYS_ADMIN",)}, "capabilities"),
        ({"host_mounts": ("/var/run/docker.sock",)}, "host mounts"),
        ({"host_network": True}, "host networking"),
        ({"pids_limit": 0}, "limits"),
    ],
)
def test_internal_callers_cannot_ask_for_an_unsafe_sandbox(unsafe, problem):
    with pytest.raises(UnsafeSandboxSpec) as excinfo:
        validate_spec(SandboxSpec(**{**SAFE, **unsafe}))
    assert problem in str(excinfo.value)


def test_a_safe_spec_passes():
    validate_spec(SandboxSpec(**SAFE))


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"privileged": True}, "sandboxes.privileged_refused"),
        ({"cap_add": ["NET_RAW"]}, "sandboxes.capabilities_refused"),
        ({"mounts": ["/:/host"]}, "sandboxes.host_mounts_refused"),
        ({"network_mode": "host"}, "sandboxes.host_network_refused"),
    ],
)
def test_the_api_refuses_privileged_workloads_and_creates_nothing(client_for, owner, body, code):
    response = client_for(owner).post("/api/v1/sandbox/", body, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == code
    assert not Sandbox.objects.exists()


@pytest.mark.django_db
def test_the_api_refuses_an_unknown_network_policy(client_for, owner):
    response = client_for(owner).post("/api/v1/sandbox/", {"network_policy": "wide"}, format="json")
    assert response.status_code == 400
    assert "network_policy" in response.json()["error"]["fields"]


@pytest.mark.django_db
def test_a_member_without_sandbox_access_cannot_request_one(client_for, owner):
    owner.membership.can_use_sandbox = False
    owner.membership.save()
    response = client_for(owner).post("/api/v1/sandbox/", {}, format="json")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "access.sandbox_not_allowed"
    assert not Sandbox.objects.exists()


@pytest.mark.django_db
@override_settings(QUOR_MAX_UPLOAD_BYTES=10)
def test_uploads_over_the_limit_get_413_before_reaching_the_sandbox(client_for, owner):
    from tests import factories

    session = factories.make_session(owner)
    response = client_for(owner).post(
        f"/api/v1/sessions/{session.pk}/files/content?path=a.bin",
        data=b"x" * 11,
        content_type="application/octet-stream",
    )
    assert response.status_code == 413
