import pytest

from apps import services
from quor.models import Membership
from tests import factories

SECRET = "ghp_test-secret-value-never-shown-0123456789"


@pytest.fixture
def github(org):
    """The organization's GitHub App, added from the catalog."""
    return services.app_enable_builtin(organization=org, catalog_key="github")


@pytest.fixture
def stranger_admin(stranger):
    """An admin of the stranger's organization."""
    return factories.make_user(
        stranger.membership.organization, role=Membership.Role.ADMIN, email="admin@globex.test"
    )
