import pytest
from django.core.management import CommandError, call_command

from quor.admin_site import may_enter_admin_site
from quor.models import Membership, Organization, User


@pytest.mark.django_db
def test_create_org_and_create_member_bootstrap_a_deployment(capsys, monkeypatch):
    call_command("create_org", "initech", "--name", "Initech")
    monkeypatch.delenv("QUOR_NEW_PASSWORD", raising=False)
    call_command("create_member", "Peter@Initech.test", "--org", "initech", "--role", "admin")
    out = capsys.readouterr().out
    password = out.split("Password (shown once): ")[1].strip()
    user = User.objects.get(email="peter@initech.test")
    assert user.check_password(password)
    assert may_enter_admin_site(user)
    assert user.membership.role == Membership.Role.ADMIN
    assert user.membership.organization == Organization.objects.get(slug="initech")


@pytest.mark.django_db
def test_create_member_takes_the_password_from_the_environment(capsys, monkeypatch, org):
    monkeypatch.setenv("QUOR_NEW_PASSWORD", "a-long-password-from-env")
    call_command("create_member", "milton@acme.test", "--org", "acme", "--no-sandbox")
    assert "shown once" not in capsys.readouterr().out
    user = User.objects.get(email="milton@acme.test")
    assert user.check_password("a-long-password-from-env")
    assert not user.membership.can_use_sandbox
    assert not may_enter_admin_site(user)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["x@acme.test", "--org", "nope"], "No organization"),
        (["not-an-email", "--org", "acme"], "not a valid email"),
        (["owner@acme.test", "--org", "acme"], "already exists"),
    ],
)
def test_create_member_refuses_bad_input_and_changes_nothing(owner, args, message):
    before = User.objects.count()
    with pytest.raises(CommandError, match=message):
        call_command("create_member", *args)
    assert User.objects.count() == before


@pytest.mark.django_db
def test_create_org_refuses_a_duplicate_slug(org):
    with pytest.raises(CommandError, match="already exists"):
        call_command("create_org", "acme", "--name", "Again")


@pytest.mark.django_db
def test_create_api_token_prints_a_working_token(capsys, owner, api_client):
    call_command("create_api_token", owner.email)
    raw = capsys.readouterr().out.strip()
    api_client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert api_client.get("/api/v1/me/").json()["email"] == owner.email


@pytest.mark.django_db
def test_seed_demo_creates_the_demo_organization_once(capsys, monkeypatch):
    monkeypatch.setenv("QUOR_DEMO_MEMBER_PASSWORD", "member-password-from-env")
    call_command("seed_demo")
    first = capsys.readouterr().out
    assert "admin@demo.quor.test" in first
    assert User.objects.get(email="member@demo.quor.test").check_password(
        "member-password-from-env"
    )
    call_command("seed_demo")
    assert "Demo organization exists." in capsys.readouterr().out
    assert Organization.objects.filter(slug="demo").count() == 1
    demo = Organization.objects.get(slug="demo")
    assert list(demo.model_providers.values_list("display_name", flat=True)) == ["Demo (scripted)"]


def test_the_scripted_demo_model_refuses_to_run_outside_development(settings):
    settings.DEBUG = False
    with pytest.raises(CommandError, match="only in development"):
        call_command("run_demo_model")
