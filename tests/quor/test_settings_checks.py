import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import override_settings

from quor.checks import check_encryption_key, check_static_tokens

ROOT = Path(__file__).resolve().parents[2]
LONG_A = "a" * 40
LONG_B = "b" * 40


def error_ids(errors):
    return sorted(error.id for error in errors)


@override_settings(QUOR_OPERATOR_TOKEN="short", QUOR_WORKER_TOKEN=LONG_B)
def test_a_short_operator_token_fails_the_checks():
    assert error_ids(check_static_tokens(None)) == ["quor.E001"]


@override_settings(QUOR_OPERATOR_TOKEN=LONG_A, QUOR_WORKER_TOKEN="x" * 31)
def test_a_short_worker_token_fails_the_checks():
    assert error_ids(check_static_tokens(None)) == ["quor.E002"]


@override_settings(QUOR_OPERATOR_TOKEN=LONG_A, QUOR_WORKER_TOKEN=LONG_A)
def test_identical_operator_and_worker_tokens_fail_the_checks():
    assert error_ids(check_static_tokens(None)) == ["quor.E003"]


@override_settings(QUOR_OPERATOR_TOKEN=LONG_A, QUOR_WORKER_TOKEN=LONG_B)
def test_long_distinct_tokens_pass():
    assert check_static_tokens(None) == []


@override_settings(QUOR_OPERATOR_TOKEN="", QUOR_WORKER_TOKEN="")
def test_unset_tokens_pass():
    assert check_static_tokens(None) == []


@pytest.mark.parametrize(
    ("debug", "key", "expected"),
    [
        (False, "", ["quor.E004"]),
        (False, "k" * 40, []),
        (True, "", []),
    ],
)
def test_the_encryption_key_is_required_outside_development(debug, key, expected):
    with override_settings(DEBUG=debug, QUOR_ENCRYPTION_KEY=key):
        assert error_ids(check_encryption_key(None)) == expected


PRODUCTION_ENV = {
    "QUOR_SECRET_KEY": "p" * 20 + "Xy9!-production-like-secret-key-value-0123456789",
    "QUOR_ENCRYPTION_KEY": "e" * 48,
    "QUOR_OPERATOR_TOKEN": LONG_A,
    "QUOR_WORKER_TOKEN": LONG_B,
    "QUOR_ALLOWED_HOSTS": "quor.example.com",
    "QUOR_SSL_REDIRECT": "true",
    "QUOR_HSTS_SECONDS": "31536000",
    "QUOR_HSTS_PRELOAD": "true",
    "QUOR_BEHIND_TLS_PROXY": "true",
}


def run_manage(*args, env_changes, drop=()):
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUOR_") and k not in drop}
    env.update(env_changes)
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_documented_production_configuration_passes_check_deploy():
    result = run_manage("check", "--deploy", "--fail-level", "WARNING", env_changes=PRODUCTION_ENV)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_startup_fails_with_a_clear_message_without_an_encryption_key():
    env = {k: v for k, v in PRODUCTION_ENV.items() if k != "QUOR_ENCRYPTION_KEY"}
    result = run_manage("check", env_changes=env)
    assert result.returncode != 0
    assert "QUOR_ENCRYPTION_KEY is not set" in result.stderr


def test_startup_fails_with_a_short_operator_token():
    result = run_manage("check", env_changes={**PRODUCTION_ENV, "QUOR_OPERATOR_TOKEN": "short"})
    assert result.returncode != 0
    assert "quor.E001" in result.stderr


def test_secrets_can_be_read_from_files(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("from-a-file-encryption-key\n")
    env = {k: v for k, v in PRODUCTION_ENV.items() if k != "QUOR_ENCRYPTION_KEY"}
    env["QUOR_ENCRYPTION_KEY_FILE"] = str(key_file)
    result = run_manage(
        "shell",
        "-c",
        "from django.conf import settings; print(settings.QUOR_ENCRYPTION_KEY)",
        env_changes=env,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "from-a-file-encryption-key"
