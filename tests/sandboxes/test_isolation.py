"""Network isolation, probed from inside real sandboxes as the sandbox user."""

import json
import os
import pwd
import re
import socket
from pathlib import Path

import pytest

from sandboxes.backends.docker import sandbox_network_gateway
from sandboxes.runtime import services
from tests import factories
from tests.docker_helpers import canary_server, container_of, host_ipv4_addresses, wait_for_port

pytestmark = [pytest.mark.docker, pytest.mark.django_db]

PROBE = r"""
import json, socket, sys
results = {}
for family, host, port in json.loads(sys.argv[1]):
    sock = socket.socket(socket.AF_INET6 if family == 6 else socket.AF_INET)
    sock.settimeout(3)
    try:
        sock.connect((host, port))
        results[f"{host}:{port}"] = "connected"
    except OSError as exc:
        results[f"{host}:{port}"] = f"{type(exc).__name__}"
    finally:
        sock.close()
print(json.dumps(results))
"""


def probe(user, targets):
    result = services.sandbox_exec(
        user=user, argv=["python3", "-c", PROBE, json.dumps(targets)], timeout_s=60
    )
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture
def canary():
    """A server on every host address: reachable from the host, so a failed probe
    means the sandbox was stopped, not that nothing listened."""
    with canary_server("0.0.0.0") as port:  # noqa: S104  (on purpose: every address)
        yield port


def test_the_proxy_port_is_reachable(running_sandbox, owner, egress_proxy):
    host, port = egress_proxy
    assert probe(owner, [[4, host, port]]) == {f"{host}:{port}": "connected"}


def test_every_host_address_is_unreachable_on_other_ports(running_sandbox, owner, canary):
    addresses = host_ipv4_addresses()
    assert sandbox_network_gateway() in addresses
    for address in addresses:
        socket.create_connection((address, canary), timeout=2).close()  # the host reaches it
    targets = [
        [4, address, port] for address in addresses for port in (canary, 5432, 6379, 2375, 22)
    ]
    results = probe(owner, targets)
    assert set(results.values()) == {"ConnectionRefusedError"}, results


def test_metadata_public_and_ipv6_destinations_are_unreachable(running_sandbox, owner):
    results = probe(
        owner, [[4, "169.254.169.254", 80], [4, "1.1.1.1", 443], [6, "2606:4700:4700::1111", 443]]
    )
    assert results["169.254.169.254:80"] == "ConnectionRefusedError"
    assert results["1.1.1.1:443"] == "ConnectionRefusedError"
    assert results["2606:4700:4700::1111:443"] != "connected"


def test_other_sandboxes_are_unreachable_but_the_control_plane_reaches_them(
    running_sandbox, owner, org, docker_client
):
    neighbour = factories.make_user(org, email="neighbour@acme.test")
    services.sandbox_ensure(user=neighbour)
    started = services.sandbox_exec(
        user=neighbour,
        argv=["setsid", "sh", "-c", "python3 -m http.server 8080 --bind 0.0.0.0 >/dev/null 2>&1 &"],
        timeout_s=10,
    )
    assert started.exit_code == 0
    from sandboxes.models import Sandbox

    neighbour_ip = next(
        iter(
            container_of(docker_client, Sandbox.objects.get(user=neighbour))
            .attrs["NetworkSettings"]["Networks"]
            .values()
        )
    )["IPAddress"]
    wait_for_port(neighbour_ip, 8080)  # the control plane (host) may open it
    assert probe(owner, [[4, neighbour_ip, 8080]]) == {
        f"{neighbour_ip}:8080": "ConnectionRefusedError"
    }


def test_the_sandbox_is_attached_only_to_its_dedicated_network(running_sandbox, docker_client):
    from sandboxes.backends.docker import DockerBackend

    networks = container_of(docker_client, running_sandbox).attrs["NetworkSettings"]["Networks"]
    assert list(networks) == [DockerBackend().network_name]
    network = docker_client.networks.get(DockerBackend().network_name)
    assert network.attrs["Internal"] is True
    assert network.attrs["Options"]["com.docker.network.bridge.enable_icc"] == "false"


def host_view_of_processes(pid_in_host: int) -> dict[int, tuple[int, str]]:
    """Every host process in the same PID namespace as `pid_in_host`: host pid to
    (real uid as the host sees it, command)."""
    namespace = os.readlink(f"/proc/{pid_in_host}/ns/pid")
    found = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if os.readlink(entry / "ns/pid") != namespace:
                continue
            status = (entry / "status").read_text()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            continue
        uid = int(re.search(r"^Uid:\s+(\d+)", status, re.MULTILINE).group(1))
        found[int(entry.name)] = (uid, command)
    return found


def test_sandbox_users_map_to_host_ids_that_no_account_owns(running_sandbox, owner, docker_client):
    inside = services.sandbox_exec(user=owner, argv=["id", "-u"], timeout_s=30)
    assert inside.stdout.decode().strip() == "1000"
    init_pid = container_of(docker_client, running_sandbox).attrs["State"]["Pid"]
    inside_start, host_start, length = map(
        int, Path(f"/proc/{init_pid}/uid_map").read_text().split()
    )
    assert (inside_start, length) == (0, 65536) and host_start not in (0, 1000)
    processes = host_view_of_processes(init_pid)
    uids = {uid for uid, _ in processes.values()}
    assert uids == {host_start, host_start + 1000}, processes  # the sandbox's root, its user
    assert any(command == "sleep infinity" for uid, command in processes.values()
               if uid == host_start + 1000), processes  # fmt: skip
    owned = [a.pw_name for a in pwd.getpwall() if host_start <= a.pw_uid < host_start + length]
    assert owned == []  # no host account owns any id a sandbox can have
