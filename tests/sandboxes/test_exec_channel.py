"""Quor's exec channel (deploy/sandbox/runtime/quor_execd.py): commands reach a sandbox
without `docker exec`, and what the sandbox's own code (or a neighbour's) can do to the
channel, tried from where they stand: inside real sandboxes, as the sandbox user."""

import json
import socket
import time

import pytest

from sandboxes.backends import channel
from sandboxes.backends.channel import HELLO, NONCE_BYTES, channel_token, proof
from sandboxes.backends.docker import DockerBackend
from sandboxes.backends.execution import read_exactly, read_frames
from sandboxes.image import EXEC_CHANNEL, EXEC_CHANNEL_PORT
from sandboxes.models import Sandbox
from sandboxes.runtime import services
from tests import factories
from tests.docker_helpers import container_of
from tests.egress.test_proxy import error_code, through_proxy
from tests.sandboxes.test_isolation import probe

pytestmark = [pytest.mark.docker, pytest.mark.django_db]

# Reads the channel's token from the service's own process, as any code of the sandbox
# user can, and asks a channel at (address, port) to run argv with it.
USE_STOLEN_TOKEN = r"""
import hashlib, hmac, json, os, socket, struct, sys
address, argv = sys.argv[1], json.loads(sys.argv[2])
token = ""
for pid in os.listdir("/proc"):
    try:
        environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    except OSError:
        continue
    for item in environ:
        if item.startswith(b"QUOR_EXEC_TOKEN="):
            token = item.split(b"=", 1)[1].decode()
try:
    sock = socket.create_connection((address, int(sys.argv[3])), timeout=3)
except OSError as exc:
    print(json.dumps({"token_found": bool(token), "error": type(exc).__name__}))
    sys.exit()
nonce = os.urandom(16)
sock.sendall(b"QUOR1\n" + nonce)
answer = b""
while len(answer) < 48:
    answer += sock.recv(48 - len(answer))
proof = hmac.new(token.encode(), b"client" + nonce + answer[:16], hashlib.sha256).hexdigest()
request = {"proof": proof, "argv": argv, "cwd": "/tmp", "env": {}, "stdin": False}
sock.sendall(json.dumps(request).encode() + b"\n")
data = b""
while chunk := sock.recv(65536):
    data += chunk
out = b""
while data:
    stream, size = struct.unpack(">BxxxL", data[:8])
    if stream == 1:
        out += data[8 : 8 + size]
    data = data[8 + size :]
print(json.dumps({"token_found": bool(token), "output": out.decode()}))
"""


def wait_for(read, expected, timeout=10):
    """Whether read() gave `expected` within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while read() != expected:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def listening(address: str) -> bool:
    try:
        socket.create_connection((address, EXEC_CHANNEL_PORT), timeout=2).close()
    except ConnectionRefusedError:
        return False
    return True


def address_of(docker_client, sandbox) -> str:
    networks = container_of(docker_client, sandbox).attrs["NetworkSettings"]["Networks"]
    return networks[DockerBackend().network_name]["IPAddress"]


def ask_channel(address: str, token: str, argv: list[str]) -> list[tuple[int, bytes]]:
    """One request from the host, as the control plane makes it (without checking the
    service's proof); every frame answered."""
    with socket.create_connection((address, EXEC_CHANNEL_PORT), timeout=10) as sock:
        nonce = b"n" * NONCE_BYTES
        sock.sendall(HELLO + nonce)
        answer = read_exactly(sock, NONCE_BYTES + 32)
        request = {"argv": argv, "cwd": "/workspace", "env": {}, "stdin": False}
        request["proof"] = proof(token, b"client", nonce + answer[:NONCE_BYTES])
        sock.sendall(json.dumps(request).encode() + b"\n")
        return list(read_frames(sock))


def run(user, argv):
    result = services.sandbox_exec(user=user, argv=argv, timeout_s=30)
    assert result.exit_code == 0, result.stderr
    return result.stdout.decode()


@pytest.fixture
def neighbour(org, running_sandbox):
    user = factories.make_user(org, email="neighbour@acme.test")
    services.sandbox_ensure(user=user)
    return user


@pytest.fixture
def no_docker_exec(monkeypatch):
    """Fails any command started with `docker exec` in this process."""

    def refuse(*args, **kwargs):
        raise AssertionError("docker exec was used")

    monkeypatch.setattr(DockerBackend, "_runtime_starter", lambda self, name: refuse)


def test_commands_and_their_stdin_reach_the_sandbox_without_docker_exec(
    running_sandbox, owner, no_docker_exec
):
    channel._addresses.clear()  # as in a new process: one inspect, then none
    assert run(owner, ["id", "-u"]).strip() == "1000"
    backend = DockerBackend()
    echoed = backend.exec(
        str(running_sandbox.pk), ["sh", "-c", "cat; echo oops >&2; exit 3"],
        cwd="/workspace", env={"NAME": "value"}, timeout_s=10, output_limit=1 << 20,
        stdin=[b"first ", b"second"],
    )  # fmt: skip
    assert (echoed.stdout, echoed.stderr, echoed.exit_code) == (b"first second", b"oops\n", 3)
    timed_out = backend.exec(
        str(running_sandbox.pk), ["sh", "-c", "sleep 30 & sleep 30"],
        cwd="/workspace", env={}, timeout_s=1, output_limit=4096,
    )  # fmt: skip
    assert timed_out.timed_out and timed_out.duration_s < 10
    count_sleeps = ["sh", "-c", "pgrep -c -x sleep || true"]
    assert wait_for(lambda: run(owner, count_sleeps).strip(), "1")  # only the keep-alive


def test_an_answer_ends_with_the_command_and_signals_are_as_under_docker_exec(
    running_sandbox, no_docker_exec
):
    """What the command leaves writing in the background neither holds the answer
    back nor streams into it for ever; SIGINT and SIGQUIT are not ignored (the service
    was started by a shell, which ignores them in its background jobs)."""
    backend, sandbox_id = DockerBackend(), str(running_sandbox.pk)
    limits = {"cwd": "/workspace", "env": {}, "timeout_s": 30, "output_limit": 4096}
    left_writing = backend.exec(sandbox_id, ["sh", "-c", "yes & sleep 0.2"], **limits)
    assert left_writing.stdout_truncated and left_writing.duration_s < 10
    ignored = backend.exec(sandbox_id, ["grep", "SigIgn", "/proc/self/status"], **limits)
    assert int(ignored.stdout.split()[1], 16) & 0b110 == 0  # SIGINT (2), SIGQUIT (3)


def test_a_wrong_token_is_refused_and_runs_nothing(running_sandbox, owner, docker_client):
    address = address_of(docker_client, running_sandbox)
    frames = ask_channel(address, "0" * 64, ["touch", "/workspace/forged"])
    assert [stream for stream, _ in frames] == [4]
    assert json.loads(frames[0][1])["code"] == "unauthorized"
    assert run(owner, ["sh", "-c", "test -e /workspace/forged && echo there || echo absent"]) == (
        "absent\n"
    )


def test_a_sandboxs_token_stolen_by_its_code_runs_nothing_it_could_not_already_run(
    running_sandbox, owner, neighbour, docker_client
):
    """The agent can read its own channel's token: it gets only itself, as itself."""
    own = address_of(docker_client, running_sandbox)
    other = address_of(docker_client, services.sandbox_ensure(user=neighbour))
    for address, expected in ((own, {"token_found": True, "output": "1000\n"}),
                              (other, {"token_found": True, "error": "ConnectionRefusedError"})):  # fmt: skip
        result = run(
            owner,
            ["python3", "-c", USE_STOLEN_TOKEN, address, '["id", "-u"]', str(EXEC_CHANNEL_PORT)],
        )
        assert json.loads(result) == expected


@pytest.mark.django_db(transaction=True)  # the proxy reads the sandboxes from its own connection
def test_neither_a_neighbour_nor_the_egress_proxy_reaches_a_sandboxs_channel(
    running_sandbox, owner, neighbour, docker_client, egress_proxy
):
    address = address_of(docker_client, running_sandbox)
    socket.create_connection((address, EXEC_CHANNEL_PORT), timeout=5).close()  # the host can
    target = f"{address}:{EXEC_CHANNEL_PORT}"
    assert probe(neighbour, [[4, address, EXEC_CHANNEL_PORT]]) == {target: "ConnectionRefusedError"}
    for attempt in ({"url": f"http://{target}/"}, {"tunnel": [address, EXEC_CHANNEL_PORT],
                                                   "url": "/"}):  # fmt: skip
        [result] = through_proxy(neighbour, [attempt])
        assert result["status"] == 403, result
        if "body" in result:
            assert error_code(result) == "egress.private_destination"


def test_a_killed_channel_leaves_commands_working_through_docker_and_comes_back(
    running_sandbox, owner, docker_client, monkeypatch
):
    container = container_of(docker_client, running_sandbox)
    address = address_of(docker_client, running_sandbox)
    killed = container.exec_run(["pkill", "-x", "-f", " ".join(EXEC_CHANNEL)], user="1000")
    assert killed.exit_code == 0
    assert wait_for(lambda: listening(address), False)
    assert run(owner, ["echo", "still here"]) == "still here\n"
    assert channel.remembered(DockerBackend().container_name(str(running_sandbox.pk))) is None
    # Started again, once, as the sandbox user: the next command needs no docker exec.
    assert wait_for(lambda: listening(address), True)
    monkeypatch.setattr(DockerBackend, "_runtime_starter", lambda self, name: None)
    assert run(owner, ["echo", "back"]) == "back\n"
    owners = container.exec_run(["pgrep", "-u", "1000", "-c", "-f", " ".join(EXEC_CHANNEL)])
    assert owners.output.decode().strip() == "1"


def test_an_address_now_another_sandboxs_runs_nothing_there(
    running_sandbox, owner, neighbour, docker_client
):
    """An address remembered from before a restart may now be a neighbour's: its
    channel refuses this sandbox's token, and the command runs where it should."""
    backend = DockerBackend()
    name = backend.container_name(str(running_sandbox.pk))
    other = services.sandbox_ensure(user=neighbour)
    channel.remember(name, address_of(docker_client, other))
    run(owner, ["touch", "/workspace/mine"])
    assert channel.remembered(name) is None
    there = run(neighbour, ["sh", "-c", "test -e /workspace/mine && echo there || echo absent"])
    assert there == "absent\n"
    assert run(owner, ["ls", "/workspace/mine"]) == "/workspace/mine\n"


# Listens where an exec channel was, writes down every byte it receives and answers 48
# made-up bytes: the sandbox's own code, after it killed its channel.
SQUATTER = r"""
import socket, sys
listener = socket.create_server(("0.0.0.0", int(sys.argv[1])))
with open(sys.argv[2], "wb") as heard:
    while True:
        connection, _ = listener.accept()
        connection.settimeout(5)
        try:
            while chunk := connection.recv(65536):
                heard.write(chunk)
                heard.flush()
                connection.sendall(bytes(48))
        except OSError:
            pass
        connection.close()
"""


def test_what_listens_at_an_address_now_another_sandboxs_learns_nothing_of_the_command(
    running_sandbox, owner, neighbour, docker_client
):
    """The neighbour's code replaced its channel, and this process still thinks the
    neighbour's address is the owner's sandbox: the owner's command is not sent there."""
    other = container_of(docker_client, services.sandbox_ensure(user=neighbour))
    address = address_of(docker_client, Sandbox.objects.get(user=neighbour))
    assert other.exec_run(["pkill", "-x", "-f", " ".join(EXEC_CHANNEL)], user="1000").exit_code == 0
    assert wait_for(lambda: listening(address), False)
    squat = ["setsid", "-f", "python3", "-c", SQUATTER, str(EXEC_CHANNEL_PORT), "/tmp/heard"]
    assert other.exec_run(squat, user="1000").exit_code == 0
    assert wait_for(lambda: listening(address), True)
    name = DockerBackend().container_name(str(running_sandbox.pk))
    channel.remember(name, address)
    run(owner, ["sh", "-c", "echo secret-4417 > /workspace/mine"])
    heard = other.exec_run(["cat", "/tmp/heard"], user="1000").output
    assert heard.startswith(HELLO) and len(heard) == len(HELLO) + NONCE_BYTES, heard
    assert channel.remembered(name) is None
    assert run(owner, ["cat", "/workspace/mine"]) == "secret-4417\n"


def test_stopping_the_sandboxs_processes_keeps_the_channel(running_sandbox, owner, no_docker_exec):
    from sandboxes import image

    run(owner, ["sh", "-c", "setsid sleep 300 >/dev/null 2>&1 &"])
    run(owner, image.stop_processes_argv())
    left = run(owner, ["sh", "-c", "pgrep -a -u 1000 | grep -v pgrep || true"])
    assert "sleep 300" not in left and "quor_execd" in left


def test_the_token_is_the_runtimes_own():
    assert channel_token("quor-test-sandbox-a") == channel_token("quor-test-sandbox-a")
    assert channel_token("quor-test-sandbox-a") != channel_token("quor-test-sandbox-b")
    assert len(channel_token("quor-test-sandbox-a")) == 64


def test_an_exec_after_the_runtime_vanished_behind_quors_back_starts_it_and_runs_once(
    running_sandbox, owner, docker_client
):
    """The row still says running: the command finds the runtime gone before anything
    started, the sandbox is ensured, and the command runs once in the new runtime."""
    container_of(docker_client, running_sandbox).remove(force=True)
    appended = run(owner, ["sh", "-c", "echo run >> /workspace/runs; cat /workspace/runs"])
    assert appended == "run\n"
    assert Sandbox.objects.get(pk=running_sandbox.pk).runtime_id != running_sandbox.runtime_id
