"""The built-in Apps: one TOML file each in `apps/catalog/`, read and checked here.

Adding a built-in App is adding a file (copy `github.toml`). A file that does not
check out is a `CatalogError` naming the file, raised the first time the catalog is
loaded (start-up, the first admin page, or the tests), never half-loaded. No Django
here: the catalog is data, checked with the same pure functions the proxy uses.
"""

import functools
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from apps import policy

CATALOG_DIR = Path(__file__).resolve().parent / "catalog"

_KEY = re.compile(r"^[a-z][a-z0-9_]{0,49}$")
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")
_METHOD = re.compile(r"^[A-Z]+$")

_APP_FIELDS = {
    "name": (str, True),
    "description": (str, False),
    "url_patterns": (list, True),
    "credential_style": (str, True),
    "credential_header": (str, False),
    "credential_help": (str, False),
    "agent_env": (str, True),
    "actions": (list, True),
}
_ACTION_FIELDS = {
    "key": (str, True),
    "name": (str, True),
    "description": (str, False),
    "methods": (list, False),
    "paths": (list, True),
    "default_policy": (str, True),
}


class CatalogError(ValueError):
    """A catalog file that is not valid; the message names the file."""


@dataclass(frozen=True)
class CatalogAction:
    key: str
    name: str
    description: str
    methods: tuple[str, ...]  # empty: any method
    paths: tuple[str, ...]
    default_policy: str


@dataclass(frozen=True)
class CatalogApp:
    key: str
    name: str
    description: str
    url_patterns: tuple[str, ...]
    credential_style: str
    credential_header: str
    credential_help: str
    agent_env: str  # the variable tools in the sandbox read the token from (GH_TOKEN, ...)
    actions: tuple[CatalogAction, ...]

    def action(self, key: str) -> CatalogAction | None:
        return next((a for a in self.actions if a.key == key), None)


def _check_fields(where: str, table, fields) -> None:
    if not isinstance(table, dict):
        raise CatalogError(f"{where}: expected a table")
    unknown = sorted(set(table) - set(fields))
    if unknown:
        raise CatalogError(f"{where}: unknown field(s) {', '.join(unknown)}")
    for name, (kind, required) in fields.items():
        if name not in table:
            if required:
                raise CatalogError(f"{where}: {name} is required")
            continue
        if not isinstance(table[name], kind):
            raise CatalogError(f"{where}: {name} must be a {kind.__name__}")


def _strings(where: str, name: str, values) -> tuple[str, ...]:
    if not all(isinstance(v, str) and v.strip() for v in values):
        raise CatalogError(f"{where}: {name} must be a list of non-empty strings")
    return tuple(values)


def _parse_action(where: str, table) -> CatalogAction:
    _check_fields(where, table, _ACTION_FIELDS)
    key = table["key"]
    where = f"{where} {key!r}"
    if not _KEY.match(key):
        raise CatalogError(f"{where}: a key is lowercase letters, digits and _")
    if not table["name"].strip():
        raise CatalogError(f"{where}: the name is empty")
    methods = _strings(where, "methods", table.get("methods", []))
    if not all(_METHOD.match(m) for m in methods):
        raise CatalogError(f"{where}: methods are upper-case HTTP methods (GET, POST, ...)")
    paths = _strings(where, "paths", table["paths"])
    if not paths:
        raise CatalogError(f"{where}: an action needs at least one path")
    try:
        policy.Action.build(key, table["name"], table["default_policy"], methods, paths)
    except policy.InvalidPattern as exc:
        raise CatalogError(f"{where}: {exc}") from None
    return CatalogAction(
        key=key,
        name=table["name"].strip(),
        description=table.get("description", "").strip(),
        methods=methods,
        paths=paths,
        default_policy=table["default_policy"],
    )


def parse_catalog_file(path: Path) -> CatalogApp:
    """One catalog file, checked; its key is the file name without `.toml`."""
    where = f"apps/catalog/{path.name}"
    key = path.stem
    if not _KEY.match(key):
        raise CatalogError(f"{where}: the file name must be a key (lowercase letters, digits, _)")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise CatalogError(f"{where}: not valid TOML: {exc}") from None
    _check_fields(where, data, _APP_FIELDS)
    if not data["name"].strip():
        raise CatalogError(f"{where}: the name is empty")
    url_patterns = _strings(where, "url_patterns", data["url_patterns"])
    if not url_patterns:
        raise CatalogError(f"{where}: at least one URL pattern is required")
    for pattern in url_patterns:
        try:
            policy.parse_url_pattern(pattern)
        except policy.InvalidPattern as exc:
            raise CatalogError(f"{where}: {exc}") from None
    style = data["credential_style"]
    if style not in policy.CREDENTIAL_STYLES:
        raise CatalogError(
            f"{where}: credential_style must be one of {', '.join(policy.CREDENTIAL_STYLES)}"
        )
    header = data.get("credential_header", "").strip()
    if style == "header" and not _HEADER_NAME.match(header):
        raise CatalogError(f"{where}: the header style needs a credential_header name")
    if style != "header" and header:
        raise CatalogError(f"{where}: credential_header is only for the header style")
    if not _ENV_NAME.match(data["agent_env"]):
        raise CatalogError(f"{where}: agent_env must be an environment variable name")
    actions = tuple(
        _parse_action(f"{where}: action {i + 1}", table) for i, table in enumerate(data["actions"])
    )
    keys = [a.key for a in actions]
    duplicates = sorted({k for k in keys if keys.count(k) > 1})
    if duplicates:
        raise CatalogError(f"{where}: duplicate action key(s) {', '.join(duplicates)}")
    return CatalogApp(
        key=key,
        name=data["name"].strip(),
        description=data.get("description", "").strip(),
        url_patterns=url_patterns,
        credential_style=style,
        credential_header=header,
        credential_help=data.get("credential_help", "").strip(),
        agent_env=data["agent_env"],
        actions=actions,
    )


def read_catalog(directory: Path = CATALOG_DIR) -> Mapping[str, CatalogApp]:
    """Every `*.toml` file of the directory, checked, by key (sorted by name)."""
    apps = [parse_catalog_file(path) for path in sorted(directory.glob("*.toml"))]
    return MappingProxyType({app.key: app for app in sorted(apps, key=lambda a: a.name.lower())})


@functools.cache
def load_catalog() -> Mapping[str, CatalogApp]:
    """The built-in Apps, read once per process."""
    return read_catalog()


def catalog_app(key: str) -> CatalogApp | None:
    return load_catalog().get(key)
