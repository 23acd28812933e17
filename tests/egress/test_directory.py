"""The proxy's directory keeps Apps between refreshes: a change to one App reaches the
proxy's decisions by reloading that App alone, and deletions, disabled Apps, policy and
credential changes still apply at the next refresh (which a change triggers at once)."""

import datetime
import itertools

import pytest

from apps import policy, services
from apps.models import App, AppAction, AppCredential
from egress import directory
from egress.decisions import Destination, decide_app
from sandboxes.models import Sandbox
from tests import factories

pytestmark = pytest.mark.django_db

ADDRESS = "10.240.0.2"
REPO = "/repos/acme/widgets"
ORG_TOKEN = "ghp_organization-token-0123456789"
OWN_TOKEN = "ghp_users-own-token-0123456789"


def make_hub(org, name, host, **fields):
    return factories.make_app(
        org,
        name=name,
        url_patterns=[f"https://{host}"],
        catalog_key=name.lower(),
        actions=[
            ("repos.read", "GET", "/repos/{owner}/{repo}", "auto"),
            ("repos.delete", "DELETE", "/repos/{owner}/{repo}", "deny"),
        ],
        **fields,
    )


@pytest.fixture
def hubs(org):
    """Three Apps of the organization, on their own hosts; the first has a credential."""
    return [
        make_hub(org, "Hub1", "hub1.test", credential=ORG_TOKEN),
        make_hub(org, "Hub2", "hub2.test"),
        make_hub(org, "Hub3", "hub3.test"),
    ]


@pytest.fixture
def sandbox(owner):
    return factories.make_sandbox(owner, state=Sandbox.State.RUNNING, network_address=ADDRESS)


@pytest.fixture
def loader(sandbox, hubs):
    """A loader that has loaded once, as the proxy's directory has after starting."""
    loader = directory.ContextLoader()
    loader.load()
    return loader


@pytest.fixture
def loaded_apps(monkeypatch):
    """The ids of the Apps each refresh loads from the database, one set per refresh."""
    calls = []
    real = directory.policy_apps

    def recording(app_ids):
        calls.append(set(app_ids))
        return real(app_ids)

    monkeypatch.setattr(directory, "policy_apps", recording)
    return calls


def decide(context, method, host, path=REPO):
    destination = Destination(host, 443, ("192.0.2.1",), intercept=True)
    return decide_app(
        context, destination, session_id=None, method=method, target=path, intercepted=True
    )


def test_a_refresh_with_nothing_changed_loads_no_app_and_keeps_the_index(loader, loaded_apps):
    before = loader.load()[ADDRESS].apps
    after = loader.load()[ADDRESS].apps
    assert loaded_apps == []
    assert after is before


def test_a_policy_change_to_one_app_reloads_that_app_alone(loader, hubs, loaded_apps):
    before = loader.load()[ADDRESS]
    assert decide(before, "GET", "hub2.test").outcome == policy.FORWARD  # not selected: bare

    services.app_set_action_policy(app=hubs[1], key="repos.read", policy="deny")
    after = loader.load()[ADDRESS]

    assert loaded_apps == [{hubs[1].pk}]
    assert decide(after, "GET", "hub2.test").reason == "apps.action_denied"
    assert after.apps.apps[hubs[0].pk] is before.apps.apps[hubs[0].pk]
    assert after.apps.apps[hubs[2].pk] is before.apps.apps[hubs[2].pk]


def test_a_deleted_action_is_seen_at_the_next_refresh(loader, hubs):
    assert decide(loader.load()[ADDRESS], "DELETE", "hub3.test").reason == "apps.action_denied"
    AppAction.objects.filter(app=hubs[2], key="repos.delete").delete()
    # Without its Deny action the request is an uncataloged one: Ask, not refused.
    assert decide(loader.load()[ADDRESS], "DELETE", "hub3.test").outcome != policy.REFUSE


def test_a_deleted_or_disabled_app_leaves_the_proxy_at_the_next_refresh(loader, hubs):
    hubs[0].delete()
    services.app_update(app=hubs[1], enabled=False)
    context = loader.load()[ADDRESS]
    assert set(context.apps.apps) == {hubs[2].pk}
    assert not context.apps.serves("hub1.test", 443)
    assert not context.apps.serves("hub2.test", 443)
    assert hubs[0].pk not in context.app_credentials


def test_a_new_app_is_indexed_at_the_next_refresh(loader, org, loaded_apps):
    added = make_hub(org, "Hub4", "hub4.test")
    context = loader.load()[ADDRESS]
    assert loaded_apps == [{added.pk}]
    assert context.apps.serves("hub4.test", 443)


def test_a_removed_credential_stops_at_the_next_refresh(loader, hubs):
    assert loader.load()[ADDRESS].app_credentials[hubs[0].pk] == (ORG_TOKEN, "organization")
    services.app_credential_clear(app=hubs[0])
    assert hubs[0].pk not in loader.load()[ADDRESS].app_credentials


def test_a_users_own_credential_wins_over_the_organizations_and_no_one_elses_is_used(
    loader, hubs, owner, colleague
):
    services.app_credential_set(app=hubs[0], user=colleague, secret="ghp_colleague-0123456789")
    assert loader.load()[ADDRESS].app_credentials[hubs[0].pk] == (ORG_TOKEN, "organization")
    services.app_credential_set(app=hubs[0], user=owner, secret=OWN_TOKEN)
    assert loader.load()[ADDRESS].app_credentials[hubs[0].pk] == (OWN_TOKEN, "user")


def test_a_change_saved_with_an_older_timestamp_than_the_newest_is_still_seen(loader, hubs):
    """A transaction that commits after a later one carries the older updated_at: a
    refresh that kept only the newest timestamp would never see it."""
    action = AppAction.objects.get(app=hubs[1], key="repos.read")
    AppAction.objects.filter(app=hubs[1], key="repos.delete").update(
        updated_at=action.updated_at + datetime.timedelta(hours=1)
    )
    loader.load()
    AppAction.objects.filter(pk=action.pk).update(
        policy="deny", updated_at=action.updated_at + datetime.timedelta(minutes=1)
    )
    assert decide(loader.load()[ADDRESS], "GET", "hub2.test").reason == "apps.action_denied"


def test_an_organization_without_sandboxes_is_forgotten_and_comes_back_whole(loader, sandbox, hubs):
    Sandbox.objects.filter(pk=sandbox.pk).update(network_address=None)
    assert loader.load() == {}
    Sandbox.objects.filter(pk=sandbox.pk).update(network_address=ADDRESS)
    assert set(loader.load()[ADDRESS].apps.apps) == {hub.pk for hub in hubs}


def test_another_organizations_change_leaves_this_index_as_it_was(loader, stranger, loaded_apps):
    factories.make_sandbox(stranger, state=Sandbox.State.RUNNING, network_address="10.240.0.3")
    before = loader.load()[ADDRESS].apps
    theirs = make_hub(stranger.membership.organization, "Hub1", "hub1.test")
    after = loader.load()
    assert after[ADDRESS].apps is before
    assert loaded_apps[-1] == {theirs.pk}
    assert set(after["10.240.0.3"].apps.apps) == {theirs.pk}


def test_the_fingerprint_changes_with_every_kind_of_change(hubs):
    """Each of these must move the App's fingerprint, or the proxy would miss it (adding
    an action and deleting it again brings back the state, and the fingerprint, before)."""
    app = hubs[0]

    def fingerprint():
        return directory.app_fingerprints([app.organization_id])[app.pk]

    seen = [fingerprint()]
    changes = [
        lambda: services.app_set_action_policy(app=app, key="repos.read", policy="ask"),
        lambda: AppAction.objects.create(
            app=app, key="x", name="X", methods=["GET"], paths=["/x"], policy="auto"
        ),
        lambda: AppAction.objects.filter(app=app, key="x").delete(),
        lambda: AppCredential.objects.filter(app=app).delete(),
        lambda: AppCredential.objects.create(app=app, secret="ghp_new-0123456789"),
        lambda: App.objects.get(pk=app.pk).save(),
    ]
    for change in changes:
        change()
        seen.append(fingerprint())
    assert all(before != after for before, after in itertools.pairwise(seen))


def test_a_change_that_moves_no_timestamp_is_seen_at_the_next_full_reload(sandbox, hubs):
    """`update()` from a shell changes no `updated_at`: the fingerprints miss it, and
    every App is loaded again at least every FULL_RELOAD_EVERY_S."""
    now = [1000.0]
    loader = directory.ContextLoader(clock=lambda: now[0])
    assert decide(loader.load()[ADDRESS], "GET", "hub2.test").outcome == policy.FORWARD
    AppAction.objects.filter(app=hubs[1]).update(policy="deny")
    AppCredential.objects.filter(app=hubs[0]).update(secret="ghp_replaced-0123456789")
    assert loader.load()[ADDRESS].app_credentials[hubs[0].pk] == (ORG_TOKEN, "organization")
    now[0] += directory.FULL_RELOAD_EVERY_S
    context = loader.load()[ADDRESS]
    assert decide(context, "GET", "hub2.test").reason == "apps.action_denied"
    assert context.app_credentials[hubs[0].pk] == ("ghp_replaced-0123456789", "organization")


def test_a_refresh_that_fails_half_way_starts_from_nothing_next_time(loader, hubs, monkeypatch):
    services.app_set_action_policy(app=hubs[1], key="repos.read", policy="deny")

    def broken(apps):  # after the fingerprints were taken in
        raise RuntimeError("out of memory")

    monkeypatch.setattr(directory, "AppIndex", broken)
    with pytest.raises(RuntimeError):
        loader.load()
    monkeypatch.undo()
    assert decide(loader.load()[ADDRESS], "GET", "hub2.test").reason == "apps.action_denied"
