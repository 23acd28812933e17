#!/usr/bin/env python3
"""Snapshot and restore of a sandbox's workspace, beside a plain `tar | zstd` on the host.

    .venv/bin/python bench/snapshot.py [--runs 3] [--source-mb 60] [--binaries 4]
        [--binary-mb 35] [--after-delete-seconds 370]

Starts a real sandbox and fills a session's directory (as the sandbox user, `MAKE_WORKSPACE`
below, seeded so every run has the same files) with about 200 MB of mixed files: a source
tree of small text files (`--source-mb`, 1-8 KiB each) and a few large random binaries
(`--binaries` x `--binary-mb`). Then, `--runs` times:

(a) baseline: on the host, `tar -cf - . | zstd -3 -T1` of the workspace volume's
    directory (Docker's mountpoint) into a file, and back: `zstd -d | tar -xf -` into an
    empty directory;
(b) Quor: `sandbox_sleep` (the snapshot made by `tar` in the sandbox without the
    managed area, read over TCP, compressed and decoded again as it is stored, the
    runtime removed) and the wake (`sandbox_ensure_running`: a new
    runtime, the snapshot streamed in, Skills and Library synchronised).

Before every timed step: `sync`, and no unpack (the baseline's or the wake's) starts
sooner than `--after-delete-seconds` after the last bulk delete (the sleep removes the
volume; the baseline's directory is removed after each run). A wake comes at least
QUOR_SANDBOX_IDLE_SECONDS after its sleep, the bench's would come seconds after it, and on
ext4 without a journal (this machine's disk) that matters: ext4 then skips, one by one,
every inode freed in the last minute (six, once their inode table block is dirty again)
when it allocates a new one (`recently_deleted` in fs/ext4/ialloc.c), and unpacking
13 000 files right after deleting as many takes 5-10 s of kernel time instead of 0.6 s
(docs/performance.md). The default wait is past those six minutes: a run takes about
7 minutes.

Throughput is the uncompressed archive's bytes over the seconds taken. Targets: restore
median < 5 s; Quor's throughput at least 0.6 of the baseline's, both directions.

Own environment like the other benches: database quor_bench_snapshots, Redis db 7,
deployment "benchsnapshots", subnet 10.237.0.0/24, file store and scratch directory
/tmp/quor-bench-snapshots. Removes its sandboxes and network at the end.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import bench_member, ensure_database, remove_network  # noqa: E402

WORK = Path("/tmp/quor-bench-snapshots")  # noqa: S108  (the bench's own scratch directory)
DATABASE = "quor_bench_snapshots"
BENCH_EMAIL = "snapshots-bench@bench.test"
ORG_SLUG = "snapshots-bench"

os.environ.update(
    {
        "DJANGO_SETTINGS_MODULE": "quor.settings",
        "QUOR_DEBUG": "1",
        "QUOR_DEPLOYMENT": "benchsnapshots",
        "QUOR_SANDBOX_SUBNET": "10.237.0.0/24",  # 10.231-10.236 belong to others here
        "QUOR_EGRESS_PROXY_PORT": "31899",  # not started: the bench needs no egress
        "DATABASE_URL": f"postgresql:///{DATABASE}",
        "REDIS_URL": "redis://127.0.0.1:6379/7",
        "QUOR_EGRESS_CA_DIR": str(WORK / "egress-ca"),
        "QUOR_FILE_STORE_DIR": str(WORK / "files"),
    }
)

# Run as the sandbox user inside the sandbox: $1 directory, $2 source MB, $3 binaries,
# $4 MB per binary.
MAKE_WORKSPACE = r"""
import os, random, sys
root = sys.argv[1]
source_mb, binaries, binary_mb = (int(value) for value in sys.argv[2:5])
rng = random.Random(7)
letters = "abcdefghijklmnopqrstuvwxyz_"
words = ["".join(rng.choices(letters, k=rng.randint(2, 12))) for _ in range(5000)]
written, n = 0, 0
while written < source_mb * 1024 * 1024:
    directory = os.path.join(root, "src", f"pkg{n // 200}", f"mod{n // 20}")
    os.makedirs(directory, exist_ok=True)
    size = rng.randint(1024, 8192)
    lines, length = [], 0
    while length < size:
        indent = "    " * rng.randint(0, 3)
        line = indent + " ".join(rng.choices(words, k=rng.randint(3, 12))) + "\n"
        lines.append(line)
        length += len(line)
    with open(os.path.join(directory, f"file{n}.py"), "w") as f:
        f.write("".join(lines))
    written += length
    n += 1
os.makedirs(os.path.join(root, "data"), exist_ok=True)
for i in range(binaries):
    with open(os.path.join(root, "data", f"blob{i}.bin"), "wb") as f:
        for _ in range(binary_mb):
            f.write(rng.randbytes(1024 * 1024))
print(n)
"""


def setup():
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from sandboxes.models import Sandbox, Session
    from sandboxes.runtime import services

    _, user, provider = bench_member(slug=ORG_SLUG, name="Snapshots bench", email=BENCH_EMAIL)
    sandbox = Sandbox.objects.filter(user=user).first()
    if sandbox is not None:
        services.sandbox_destroy(sandbox=sandbox)  # and its snapshots
    sandbox = services.sandbox_ensure(user=user)
    session = Session.objects.create(
        owner=user, sandbox=sandbox, model_provider=provider, model_name="claude-bench"
    )
    return sandbox, session


def fill_workspace(sandbox, session, args) -> int:
    from sandboxes.runtime import services

    directory = services.session_workspace_ensure(session=session)
    result = services.get_backend(sandbox.backend).exec(
        sandbox.backend_sandbox_id,
        ["python3", "-c", MAKE_WORKSPACE, directory, str(args.source_mb), str(args.binaries),
         str(args.binary_mb)],
        cwd=directory, env={}, timeout_s=600, output_limit=1 << 16,
    )  # fmt: skip
    if result.exit_code != 0:
        raise SystemExit(f"could not fill the workspace: {result.stderr.decode()}")
    return int(result.stdout)


def volume_directory(sandbox) -> Path:
    from sandboxes.backends.docker import DockerBackend

    name = DockerBackend().volume_name(sandbox.backend_sandbox_id)
    inspected = subprocess.run(  # noqa: S603
        ["docker", "volume", "inspect", "-f", "{{.Mountpoint}}", name],  # noqa: S607
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return Path(inspected.stdout.strip())


class Disk:
    """Rests before timed steps (see the module's docstring)."""

    def __init__(self, after_delete: float):
        self.after_delete = after_delete
        self.last_delete = time.monotonic()

    def deleted(self) -> None:
        self.last_delete = time.monotonic()

    def rest(self, *, unpacking: bool) -> None:
        subprocess.run(["sync"], check=True)  # noqa: S607
        if unpacking:
            time.sleep(max(0.0, self.last_delete + self.after_delete - time.monotonic()))
        time.sleep(1)


def baseline_pack(directory: Path, disk: Disk) -> tuple[float, int, int]:
    """(seconds, archive bytes, compressed bytes) of tar | zstd."""
    archive = WORK / "baseline.tar.zst"
    disk.rest(unpacking=False)
    started = time.perf_counter()
    subprocess.run(  # noqa: S602  (a fixed pipeline, the measured baseline)
        f"tar -C {directory} -cf - . | zstd -3 -T1 -q -f -o {archive}",
        shell=True, executable="/bin/bash", check=True,
    )  # fmt: skip
    packed = time.perf_counter() - started
    counted = subprocess.run(  # noqa: S602  (its size, not timed)
        f"tar -C {directory} -cf - . | wc -c",
        shell=True, executable="/bin/bash", check=True, capture_output=True, text=True,
    )  # fmt: skip
    return packed, int(counted.stdout), archive.stat().st_size


def baseline_unpack(target: Path, disk: Disk) -> float:
    target.mkdir(parents=True)
    disk.rest(unpacking=True)
    started = time.perf_counter()
    subprocess.run(  # noqa: S602
        f"zstd -d -q -c {WORK}/baseline.tar.zst | tar -C {target} -xf -",
        shell=True, executable="/bin/bash", check=True,
    )  # fmt: skip
    return time.perf_counter() - started


def timed(module, name: str, into: dict):
    """Wraps module.name so that its duration lands in `into[name]`."""
    original = getattr(module, name)

    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            into[name] = time.perf_counter() - started

    setattr(module, name, wrapper)


def one_run(sandbox, phases: dict, disk: Disk) -> tuple[tuple, dict]:
    """Baseline pack, sleep (snapshot_take: tar in the sandbox, read over TCP, checked,
    compressed, stored, decoded as stored; then the runtime and its volume removed),
    baseline unpack, wake (snapshot_restore: read, check, decompress, unpack over TCP)."""
    from sandboxes.runtime import services

    pack, tar_bytes, compressed = baseline_pack(volume_directory(sandbox), disk)
    disk.rest(unpacking=False)
    started = time.perf_counter()
    snapshot = services.sandbox_sleep(sandbox=sandbox, force=True)
    slept = time.perf_counter() - started
    disk.deleted()
    target = WORK / "baseline-restore"
    unpack = baseline_unpack(target, disk)
    disk.rest(unpacking=True)
    started = time.perf_counter()
    services.sandbox_ensure_running(sandbox)
    woke = time.perf_counter() - started
    shutil.rmtree(target)
    disk.deleted()
    return (pack, unpack, tar_bytes, compressed), {
        "sleep": slept,
        "wake": woke,
        "snapshot": phases["snapshot_take"],
        "restore": phases["snapshot_restore"],
        "bytes": snapshot.workspace_bytes,
        "compressed": snapshot.size,
    }


def mbps(size: int, seconds: float) -> float:
    return size / seconds / 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--source-mb", type=int, default=60, help="small text files, in MB")
    parser.add_argument("--binaries", type=int, default=4, help="large random files")
    parser.add_argument("--binary-mb", type=int, default=35, help="size of each, in MB")
    parser.add_argument(
        "--after-delete-seconds", type=float, default=370,
        help="no unpack starts sooner after a bulk delete",
    )  # fmt: skip
    args = parser.parse_args()
    disk = Disk(args.after_delete_seconds)
    WORK.mkdir(parents=True, exist_ok=True)
    ensure_database(DATABASE)
    began = time.monotonic()
    shutil.rmtree(WORK / "baseline-restore", ignore_errors=True)
    sandbox, session = setup()
    disk.deleted()  # what a previous run left was removed just now
    from sandboxes.runtime import services

    phases = {}
    timed(services, "snapshot_take", phases)
    timed(services, "snapshot_restore", phases)
    try:
        files = fill_workspace(sandbox, session, args)
        rows = []
        for run in range(1, args.runs + 1):
            base, quor = one_run(sandbox, phases, disk)
            sandbox.refresh_from_db()
            rows.append((base, quor))
            print(
                f"run {run}: baseline pack {base[0]:.2f} s, unpack {base[1]:.2f} s; Quor "
                f"snapshot {quor['snapshot']:.2f} s (sleep {quor['sleep']:.2f} s), restore "
                f"{quor['restore']:.2f} s (wake {quor['wake']:.2f} s)",
                flush=True,
            )
    finally:
        services.sandbox_destroy(sandbox=sandbox)
        print(f"cleanup: {remove_network()}")
    report(args, files, rows)
    print(f"{os.cpu_count()} CPUs; load average after {os.getloadavg()[0]:.2f}; "
          f"the bench took {time.monotonic() - began:.0f} s")  # fmt: skip


def report(args, files, rows) -> None:
    base, quor = rows[-1]
    print(
        f"\nWorkspace: {files} source files and {args.binaries} binaries; archive "
        f"{base[2] / 1e6:.1f} MB as tar on the host, {quor['bytes'] / 1e6:.1f} MB as Quor's "
        f"(without the managed area); compressed {base[3] / 1e6:.1f} MB (tar | zstd) and "
        f"{quor['compressed'] / 1e6:.1f} MB (Quor)\n"
    )
    print("| run | tar+zstd s | MB/s | Quor snapshot s | MB/s | ratio | sleep s | "
          "zstd+untar s | MB/s | Quor restore s | MB/s | ratio | wake s |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    ratios = []
    for run, (base, quor) in enumerate(rows, 1):
        pack, unpack = mbps(base[2], base[0]), mbps(base[2], base[1])
        snap, restore = mbps(quor["bytes"], quor["snapshot"]), mbps(quor["bytes"], quor["restore"])
        ratios.append((snap / pack, restore / unpack))
        print(
            f"| {run} | {base[0]:.2f} | {pack:.0f} | {quor['snapshot']:.2f} | {snap:.0f} | "
            f"{snap / pack:.2f} | {quor['sleep']:.2f} | {base[1]:.2f} | {unpack:.0f} | "
            f"{quor['restore']:.2f} | {restore:.0f} | {restore / unpack:.2f} | {quor['wake']:.2f} |"
        )
    wake = statistics.median(quor["wake"] for _, quor in rows)
    snap_ratio = statistics.median(r[0] for r in ratios)
    restore_ratio = statistics.median(r[1] for r in ratios)
    print()
    for name, value, good in (
        ("wake (restore) median", f"{wake:.2f} s (target < 5 s)", wake < 5),
        ("snapshot throughput / baseline", f"{snap_ratio:.2f} (target >= 0.6)", snap_ratio >= 0.6),
        ("restore throughput / baseline", f"{restore_ratio:.2f} (target >= 0.6)",
         restore_ratio >= 0.6),
    ):  # fmt: skip
        print(f"{name}: {value}: {'PASS' if good else 'MISS'}")


if __name__ == "__main__":
    main()
