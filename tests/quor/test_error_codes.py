"""Every stable error code that the code raises is documented in docs/errors.md."""

import importlib.util
import re
from pathlib import Path

from quor.lib.permissions import Permission

ROOT = Path(__file__).resolve().parents[2]
SOURCE_DIRS = ["quor", "sandboxes", "apps", "approvals", "webapps", "egress", "deploy"]
PREFIXES = "access|models|files|exec|sandboxes|sessions|egress|approvals|apps|webapps|tunnels|tokens|members"
CODE_PATTERNS = [
    re.compile(r'\bcode\s*=\s*"([a-z_.]+)"'),
    re.compile(r'error_response\(\s*\d+,\s*"([a-z_.]+)"'),
    re.compile(r'^\s+drf_exceptions\.\w+: "([a-z_.]+)"', re.MULTILINE),
    re.compile(rf'"((?:{PREFIXES})\.[a-z_]+)"'),
]


def is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def codes_in_source() -> set[str]:
    codes = set()
    for directory in SOURCE_DIRS:
        for path in (ROOT / directory).rglob("*.py"):
            text = path.read_text()
            for pattern in CODE_PATTERNS:
                codes.update(pattern.findall(text))
    permissions = {permission.value for permission in Permission}  # README, Roles
    return {code for code in codes if not is_module(code) and code not in permissions}


def test_every_error_code_in_the_source_is_documented():
    documented = set(
        re.findall(r"^\| `([a-z_.]+)` \|", (ROOT / "docs/errors.md").read_text(), re.MULTILINE)
    )
    found = codes_in_source()
    assert len(found) > 20
    assert found - documented == set()
