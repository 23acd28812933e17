import pytest
from rest_framework.test import APIClient

from quor import services
from quor.models import Membership
from tests import factories


@pytest.fixture
def org(db):
    return factories.make_org(name="Acme", slug="acme")


@pytest.fixture
def owner(org):
    """The persona who owns the objects under test."""
    return factories.make_user(org, email="owner@acme.test")


@pytest.fixture
def colleague(org):
    """A member of the owner's organization."""
    return factories.make_user(org, email="colleague@acme.test")


@pytest.fixture
def org_admin(org):
    return factories.make_user(org, role=Membership.Role.ADMIN, email="admin@acme.test")


@pytest.fixture
def stranger(db):
    """A user of another organization."""
    other = factories.make_org(name="Globex", slug="globex")
    return factories.make_user(other, email="stranger@globex.test")


@pytest.fixture
def superuser(db):
    from quor.models import User

    return User.objects.create_superuser(email="root@quor.test", password=factories.PASSWORD)


@pytest.fixture
def api_client():
    return APIClient()


@pytest.fixture
def client_for():
    """An API client authenticated as the given user with a personal API token."""

    def make(user):
        _, raw_token = services.api_token_create(user=user, name="tests")
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_token}")
        return client

    return make


@pytest.fixture(scope="session", autouse=True)
def empty_test_redis():
    """Tests use their own Redis database (REDIS_URL in pyproject); start it empty so
    no task or message from an earlier run leaks in."""
    import redis
    from django.conf import settings

    client = redis.Redis.from_url(settings.REDIS_URL)
    client.flushdb()
    client.close()
