"""Host-side helpers the bench scripts share (each script still forces its own
environment: database, Redis db, deployment, subnet, ports)."""

import os
import socket
import subprocess
from pathlib import Path


def own_environment(*, database: str, redis_db: int, work: Path, **quor: str) -> None:
    """A bench's own environment, before Django starts: no QUOR_ variable of the
    caller's, development settings, its own database, Redis db and scratch directory,
    and the QUOR_ values given (by their names without the prefix)."""
    for name in [n for n in os.environ if n.startswith("QUOR_")]:
        del os.environ[name]
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "quor.settings",
            "QUOR_DEBUG": "1",
            "DATABASE_URL": f"postgresql:///{database}",
            "REDIS_URL": f"redis://127.0.0.1:6379/{redis_db}",
            "QUOR_FILE_STORE_DIR": str(work / "files"),
            "QUOR_EGRESS_CA_DIR": str(work / "egress-ca"),
            "PYTHONUNBUFFERED": "1",
            **{f"QUOR_{name}": value for name, value in quor.items()},
        }
    )


def port_open(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=0.5).close()
        return True
    except OSError:
        return False


def port_free(port: int) -> bool:
    """Whether nothing listens on the TCP port (a connect test would lie here: this
    machine's network accepts connections to any address it does not route locally)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is no user
        try:
            probe.bind(("0.0.0.0", port))  # noqa: S104  (a probe, closed at once: any address)
            return True
        except OSError:
            return False


def process_group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def ensure_database(name: str) -> None:
    """Creates the bench's own database if it is missing (migrations come after)."""
    query = f"SELECT 1 FROM pg_database WHERE datname = '{name}'"  # noqa: S608
    found = subprocess.run(  # noqa: S603
        ["psql", "-d", "postgres", "-tAc", query],  # noqa: S607
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if found != "1":
        createdb = ["createdb", name]
        if os.geteuid() == 0:
            createdb = ["runuser", "-u", "postgres", "--", "createdb", "-O", "root", name]
        subprocess.run(createdb, check=True)  # noqa: S603


def host_cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


def remove_network() -> str:
    """Removes what the bench's deployment left in Docker: runtimes, then its network."""
    from sandboxes.backends.docker import DockerBackend

    backend = DockerBackend()
    for instance in backend.list_instances():
        backend.destroy(instance.sandbox_id, remove_workspace=True)
    try:
        network = backend.client.networks.get(backend.network_name)
    except Exception:
        return f"network {backend.network_name}: already absent"
    network.remove()
    return f"network {backend.network_name}: removed"


def p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def summary_p99(name: str, samples: list[float], *, width: int = 36, digits: int = 2) -> str:
    """One line: count, min, median and p99, in milliseconds."""
    import statistics

    figures = (min(samples), statistics.median(samples), p99(samples))
    low, middle, high = (f"{value * 1000:7.{digits}f}" for value in figures)
    return f"{name:<{width}} n={len(samples):<4} min={low} ms  median={middle} ms  p99={high} ms"


def ms(seconds) -> str:
    return "—" if seconds is None else f"{seconds * 1000:.2f}"


def bench_member(*, slug: str, name: str, email: str):
    """The bench's organization, member and model provider, created if missing; the
    member's earlier sessions (their events, approvals, web apps) and the organization's
    providers go first. Returns (organization, user, provider)."""
    from quor import services as quor_services
    from quor.models import ModelProvider, Organization, User
    from sandboxes.models import Session

    organization = Organization.objects.filter(slug=slug).first()
    organization = organization or quor_services.organization_create(slug=slug, name=name)
    user = User.objects.filter(email=email).first() or quor_services.member_create(
        email=email, organization=organization
    )
    Session.objects.filter(owner=user).delete()
    ModelProvider.objects.filter(organization=organization).delete()
    provider = quor_services.model_provider_create(
        organization=organization,
        kind=ModelProvider.Kind.ANTHROPIC,
        display_name="Bench provider",
        api_key="sk-bench-provider-key-not-a-real-one",
        base_url="https://provider.bench.invalid",
        model_names=["claude-bench"],
    )
    return organization, user, provider


def start_process_group(argv: list[str], log: Path, *, env: dict | None = None, cwd=None):
    """A process in a process group of its own (it may fork: proxy.py's acceptors,
    Celery's pool), its output in `log`; stop it with `stop_process_group`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as output:
        return subprocess.Popen(  # noqa: S603
            argv,
            cwd=cwd,
            env=env if env is not None else os.environ.copy(),
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop_process_group(process, grace: float = 10) -> None:
    """SIGTERM to the process's group, then SIGKILL to what is left of it after `grace`
    seconds (forked children may outlive their parent)."""
    import signal
    import time

    for number, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5)):
        try:
            os.killpg(process.pid, number)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            process.poll()
            if not process_group_alive(process.pid):
                break
            time.sleep(0.1)
        else:
            continue
        break
    process.poll()
