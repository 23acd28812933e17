import pytest
from django.test import override_settings


def test_healthz_answers_while_the_process_is_alive(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


@pytest.mark.django_db
@pytest.mark.docker
def test_readyz_reports_every_part_ok_with_real_services(client):
    response = client.get("/readyz")
    assert response.status_code == 200, response.json()
    assert response.json()["checks"] == {
        "postgresql": "ok",
        "redis": "ok",
        "sandbox_backend": "ok",
        "file_store": "ok",
    }


@pytest.mark.django_db
@override_settings(REDIS_URL="redis://127.0.0.1:1/0")
def test_readyz_names_the_failing_part(client):
    response = client.get("/readyz")
    assert response.status_code == 503
    checks = response.json()["checks"]
    assert checks["redis"].startswith("error:")
    assert checks["postgresql"] == "ok"


@pytest.mark.django_db
def test_readyz_reports_an_unreachable_docker_engine(client, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    checks = client.get("/readyz").json()["checks"]
    assert checks["sandbox_backend"].startswith("error:")
