"""requirements.lock is what gets installed: it must hold every direct pin as written."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PIN = re.compile(r"^([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==([^\s;#\\]+)")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: Path) -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        if match := PIN.match(line.strip()):
            found[canonical(match[1])] = match[2]
    return found


def locked_entries() -> dict[str, str]:
    """Each locked requirement with its continuation lines (hashes), by name."""
    entries, current = {}, None
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if match := PIN.match(line):
            current = canonical(match[1])
            entries[current] = line
        elif current and line.startswith("    --hash="):
            entries[current] += line
        else:
            current = None
    return entries


def test_the_lock_pins_every_direct_requirement_at_its_version():
    locked = pins(ROOT / "requirements.lock")
    for requirements in ("requirements.txt", "requirements-dev.txt"):
        for name, version in pins(ROOT / requirements).items():
            assert locked.get(name) == version, (
                f"{requirements} pins {name}=={version}, requirements.lock has "
                f"{locked.get(name)}: run `make lock`"
            )


def test_every_locked_package_carries_the_hashes_of_its_files():
    entries = locked_entries()
    assert len(entries) > 50  # the transitive packages are there too
    assert {"asgiref", "twisted", "botocore", "pip"} <= entries.keys()
    for name, entry in entries.items():
        assert "--hash=sha256:" in entry, f"{name} has no hash in requirements.lock"
