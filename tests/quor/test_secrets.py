"""Provider keys: encrypted at rest with their own key, never shown, never logged."""

import logging
import os
import subprocess
import sys

import pytest
from django.conf import settings
from django.db import connection

from tests import factories

SECRET = "sk-ant-very-secret-value-42"


@pytest.mark.django_db
def test_the_key_is_encrypted_in_the_database(org):
    provider = factories.make_provider(org, api_key=SECRET)
    with connection.cursor() as cursor:
        cursor.execute("SELECT api_key FROM quor_modelprovider WHERE id = %s", [provider.pk])
        stored = bytes(cursor.fetchone()[0])
    assert SECRET.encode() not in stored
    provider.refresh_from_db()
    assert provider.api_key == SECRET


@pytest.mark.django_db
def test_api_and_admin_requests_do_not_log_the_key(
    client_for, client, org_admin, superuser, caplog
):
    caplog.set_level(logging.DEBUG)
    api = client_for(org_admin)
    created = api.post(
        "/api/v1/model-providers/",
        {"kind": "anthropic", "display_name": "A", "api_key": SECRET, "model_names": ["m"]},
        format="json",
    ).json()
    api.get(f"/api/v1/model-providers/{created['id']}/")
    client.force_login(superuser)
    client.get(f"/admin/quor/modelprovider/{created['id']}/change/")
    assert SECRET not in caplog.text


def _read_key_in_subprocess(provider_id, **env_changes):
    """Reads the stored key in a fresh process, as a restarted server would."""
    database = settings.DATABASES["default"]["NAME"]
    env = {**os.environ, "DATABASE_URL": f"postgresql:///{database}", **env_changes}
    code = (
        "import django; django.setup();"
        "from quor.models import ModelProvider;"
        f"print(ModelProvider.objects.get(pk={provider_id}).api_key)"
    )
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_rotating_secret_key_keeps_credentials_readable_but_a_new_encryption_key_does_not(org):
    provider = factories.make_provider(org, api_key=SECRET)
    rotated = _read_key_in_subprocess(
        provider.pk, QUOR_SECRET_KEY="a-completely-different-secret-key-value"
    )
    assert rotated.returncode == 0, rotated.stderr
    assert rotated.stdout.strip() == SECRET

    wrong_key = _read_key_in_subprocess(provider.pk, QUOR_ENCRYPTION_KEY="another-encryption-key")
    assert SECRET not in wrong_key.stdout
