"""Typed readers for settings that come from the environment.

A setting `NAME` may also be given as `NAME_FILE`, the path of a file holding the
value (Docker and Kubernetes secrets), as healthchecks.io does.
"""

import json
import os


class ConfigurationError(Exception):
    """A setting has a value that cannot be used."""


def env(name: str, default: str = "") -> str:
    file_path = os.environ.get(f"{name}_FILE")
    if file_path:
        with open(file_path, encoding="utf-8") as f:
            return f.read().strip()
    return os.environ.get(name, default)


def envbool(name: str, default: bool) -> bool:
    value = env(name, "")
    if value == "":
        return default
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ConfigurationError(f"{name} must be true or false, got {value!r}")


def envint(name: str, default: int) -> int:
    value = env(name, "")
    if value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ConfigurationError(f"{name} must be an integer, got {value!r}") from None


def envlist(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in env(name, default).split(",") if item.strip()]


def envjson(name: str, default: str, kind: type):
    """A JSON value of the given kind (dict or list)."""
    value = env(name, "") or default
    try:
        parsed = json.loads(value)
    except ValueError:
        raise ConfigurationError(f"{name} must be JSON, got {value!r}") from None
    if not isinstance(parsed, kind):
        raise ConfigurationError(f"{name} must be a JSON {kind.__name__}, got {value!r}")
    return parsed
