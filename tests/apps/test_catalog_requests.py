"""Real requests to each built-in App are the action the catalog says, with its default
policy: built from enabled Apps exactly as the egress proxy builds them."""

from urllib.parse import urlsplit

import pytest

from apps import policy, selectors, services
from apps.catalog import load_catalog

AUTO, ASK, DENY = policy.AUTO, policy.ASK, policy.DENY
OUTCOME = {AUTO: policy.CREDENTIAL, ASK: policy.PARK, DENY: policy.REFUSE}
UNCATALOGED = policy.UNCATALOGED

GH = "https://api.github.com"
SLACK = "https://slack.com/api"
JIRA = "https://acme.atlassian.net"
NOTION = "https://api.notion.com"

REQUESTS = {
    "github": [
        ("GET", f"{GH}/user", "read_profile", AUTO),
        ("GET", f"{GH}/repos/acme/web", "get_repository", AUTO),
        ("GET", f"{GH}/user/repos?per_page=100", "get_repository", AUTO),
        ("GET", f"{GH}/repos/acme/web/contents/src/app.py?ref=main", "read_contents", AUTO),
        ("HEAD", f"{GH}/repos/acme/web/readme", "read_contents", AUTO),
        ("GET", f"{GH}/repos/acme/web/git/trees/main?recursive=1", "read_contents", AUTO),
        ("GET", f"{GH}/repos/acme/web/compare/main...feature", "read_contents", AUTO),
        ("PUT", f"{GH}/repos/acme/web/contents/README.md", "write_contents", ASK),
        ("POST", f"{GH}/repos/acme/web/git/refs", "write_contents", ASK),
        ("GET", f"{GH}/repos/acme/web/issues?state=open", "list_issues", AUTO),
        ("GET", f"{GH}/repos/acme/web/issues/42", "list_issues", AUTO),
        ("POST", f"{GH}/repos/acme/web/issues", "create_issue", ASK),
        ("PATCH", f"{GH}/repos/acme/web/issues/42", "update_issue", ASK),
        ("POST", f"{GH}/repos/acme/web/issues/42/labels", "update_issue", ASK),
        ("GET", f"{GH}/repos/acme/web/issues/42/comments", "list_issue_comments", AUTO),
        ("POST", f"{GH}/repos/acme/web/issues/42/comments", "create_issue_comment", ASK),
        ("PATCH", f"{GH}/repos/acme/web/issues/comments/9", "update_issue_comment", ASK),
        ("GET", f"{GH}/repos/acme/web/pulls", "list_pull_requests", AUTO),
        ("GET", f"{GH}/repos/acme/web/pulls/7/files", "list_pull_requests", AUTO),
        ("POST", f"{GH}/repos/acme/web/pulls", "create_pull_request", ASK),
        ("POST", f"{GH}/repos/acme/web/pulls/7/reviews", "update_pull_request", ASK),
        ("PATCH", f"{GH}/repos/acme/web/pulls/7", "update_pull_request", ASK),
        ("PUT", f"{GH}/repos/acme/web/pulls/7/merge", "merge_pull_request", ASK),
        ("GET", f"{GH}/repos/acme/web/actions/runs/5/logs", "read_actions", AUTO),
        (
            "POST",
            f"{GH}/repos/acme/web/actions/workflows/ci.yml/dispatches",
            "run_workflows",
            ASK,
        ),
        ("POST", f"{GH}/orgs/acme/repos", "create_repository", ASK),
        ("GET", f"{GH}/search/code?q=token+org:acme", "search", AUTO),
        ("POST", f"{GH}/graphql", "graphql", ASK),
        ("GET", f"{GH}/repos/acme/web/hooks", "manage_webhooks", DENY),
        ("POST", f"{GH}/repos/acme/web/hooks", "manage_webhooks", DENY),
        ("PATCH", f"{GH}/repos/acme/web/hooks/12/config", "manage_webhooks", DENY),
        ("DELETE", f"{GH}/repos/acme/web/hooks/12", "manage_webhooks", DENY),
        ("POST", f"{GH}/orgs/acme/hooks", "manage_webhooks", DENY),
        ("PUT", f"{GH}/repos/acme/web/collaborators/mallory", "manage_collaborators", DENY),
        ("POST", f"{GH}/repos/acme/web/keys", "manage_collaborators", DENY),
        ("PATCH", f"{GH}/repos/acme/web", "update_repository_settings", DENY),
        ("DELETE", f"{GH}/repos/acme/web", "delete_repository", DENY),
        ("GET", f"{GH}/repos/acme/web/secret-scanning/alerts", UNCATALOGED, ASK),
        ("DELETE", f"{GH}/repos/acme/web/issues/comments/9", UNCATALOGED, ASK),
    ],
    "slack": [
        ("GET", f"{SLACK}/conversations.list?limit=200", "read_conversations", AUTO),
        ("POST", f"{SLACK}/conversations.history", "read_conversations", AUTO),
        ("GET", f"{SLACK}/conversations.info?channel=C1", "read_conversations", AUTO),
        ("POST", f"{SLACK}/users.list", "read_users", AUTO),
        ("GET", f"{SLACK}/users.info?user=U1", "read_users", AUTO),
        ("GET", f"{SLACK}/files.info?file=F1", "read_files", AUTO),
        ("GET", f"{SLACK}/search.messages?query=deploy", "search_messages", AUTO),
        ("POST", f"{SLACK}/chat.postMessage", "post_message", ASK),
        ("GET", f"{SLACK}/chat.postMessage?channel=C1&text=hi", "post_message", ASK),
        ("POST", f"{SLACK}/chat.update", "update_message", ASK),
        ("POST", f"{SLACK}/chat.delete", "delete_message", DENY),
        ("GET", f"{SLACK}/chat.delete?channel=C1&ts=1.2", "delete_message", DENY),
        ("POST", f"{SLACK}/reactions.add", "react_and_pin", ASK),
        ("POST", f"{SLACK}/files.upload", "upload_files", ASK),
        ("POST", f"{SLACK}/files.getUploadURLExternal", "upload_files", ASK),
        ("POST", f"{SLACK}/files.completeUploadExternal", "upload_files", ASK),
        ("POST", f"{SLACK}/files.delete", "delete_files", DENY),
        ("POST", f"{SLACK}/conversations.create", "create_channel", ASK),
        ("POST", f"{SLACK}/conversations.setTopic", "update_channel", ASK),
        ("POST", f"{SLACK}/conversations.invite", "invite_to_channel", ASK),
        ("POST", f"{SLACK}/conversations.archive", "archive_channel", ASK),
        ("POST", f"{SLACK}/conversations.kick", "remove_from_channel", DENY),
        ("POST", f"{SLACK}/admin.users.remove", UNCATALOGED, ASK),
    ],
    "jira": [
        ("GET", f"{JIRA}/rest/api/3/search/jql?jql=project%3DACME", "search_issues", AUTO),
        ("POST", f"{JIRA}/rest/api/3/search/jql", "search_issues", AUTO),
        ("GET", f"{JIRA}/rest/api/2/search?jql=assignee%3DcurrentUser()", "search_issues", AUTO),
        ("GET", f"{JIRA}/rest/api/3/issue/ACME-1", "get_issue", AUTO),
        ("GET", f"{JIRA}/rest/api/3/issue/ACME-1/comment", "get_issue", AUTO),
        ("GET", f"{JIRA}/rest/api/3/project/ACME", "read_projects", AUTO),
        ("GET", f"{JIRA}/rest/api/3/myself", "read_users", AUTO),
        ("GET", f"{JIRA}/rest/api/3/field", "read_configuration", AUTO),
        ("POST", f"{JIRA}/rest/api/3/issue", "create_issue", ASK),
        ("PUT", f"{JIRA}/rest/api/3/issue/ACME-1", "edit_issue", ASK),
        ("POST", f"{JIRA}/rest/api/3/issue/ACME-1/comment", "comment_issue", ASK),
        ("POST", f"{JIRA}/rest/api/3/issue/ACME-1/transitions", "transition_issue", ASK),
        ("PUT", f"{JIRA}/rest/api/3/issue/ACME-1/assignee", "assign_issue", ASK),
        ("POST", f"{JIRA}/rest/api/3/issue/ACME-1/attachments", "add_attachment", ASK),
        ("GET", f"{JIRA}/rest/agile/1.0/board/3/sprint", "read_boards", AUTO),
        ("POST", f"{JIRA}/rest/agile/1.0/sprint/5/issue", "plan_sprints", ASK),
        ("POST", f"{JIRA}/rest/api/3/project/ACME/archive", "archive_project", ASK),
        ("DELETE", f"{JIRA}/rest/api/3/issue/ACME-1", "delete_issue", DENY),
        ("DELETE", f"{JIRA}/rest/api/3/project/ACME", "delete_project", DENY),
        ("POST", f"{JIRA}/rest/api/3/project/ACME/delete", "delete_project", DENY),
        ("DELETE", f"{JIRA}/rest/api/3/issue/ACME-1/comment/10", UNCATALOGED, ASK),
    ],
    "notion": [
        ("POST", f"{NOTION}/v1/search", "search", AUTO),
        ("GET", f"{NOTION}/v1/pages/abc123", "read_pages", AUTO),
        ("GET", f"{NOTION}/v1/pages/abc123/properties/title", "read_pages", AUTO),
        ("GET", f"{NOTION}/v1/databases/d1", "read_databases", AUTO),
        ("GET", f"{NOTION}/v1/data_sources/ds1", "read_databases", AUTO),
        ("POST", f"{NOTION}/v1/databases/d1/query", "query_databases", AUTO),
        ("POST", f"{NOTION}/v1/data_sources/ds1/query", "query_databases", AUTO),
        ("GET", f"{NOTION}/v1/blocks/b1/children?page_size=100", "read_blocks", AUTO),
        ("GET", f"{NOTION}/v1/users/me", "read_users", AUTO),
        ("GET", f"{NOTION}/v1/comments?block_id=b1", "read_comments", AUTO),
        ("POST", f"{NOTION}/v1/comments", "create_comment", ASK),
        ("POST", f"{NOTION}/v1/pages", "create_page", ASK),
        ("PATCH", f"{NOTION}/v1/pages/abc123", "update_page", ASK),
        ("PATCH", f"{NOTION}/v1/blocks/b1/children", "append_blocks", ASK),
        ("PATCH", f"{NOTION}/v1/blocks/b1", "update_block", ASK),
        ("DELETE", f"{NOTION}/v1/blocks/b1", "delete_block", ASK),
        ("POST", f"{NOTION}/v1/databases", "create_database", ASK),
        ("PATCH", f"{NOTION}/v1/data_sources/ds1", "update_database", ASK),
        ("POST", f"{NOTION}/v1/file_uploads", "upload_files", ASK),
        ("POST", f"{NOTION}/v1/file_uploads/f1/send", "upload_files", ASK),
        ("DELETE", f"{NOTION}/v1/pages/abc123", UNCATALOGED, ASK),
    ],
}

ROWS = [(app, *row) for app, rows in REQUESTS.items() for row in rows]


def decide(index, session, method, url):
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    return policy.decide_app_request(
        index,
        session,
        method=method,
        scheme=parts.scheme,
        host=parts.hostname,
        port=port,
        target=target,
    )


@pytest.fixture
def catalog_apps(org):
    """Every built-in App, enabled in one organization, as the proxy sees them."""
    apps = {
        key: services.app_enable_builtin(organization=org, catalog_key=key)
        for key in load_catalog()
    }
    plain = [selectors.policy_app(app) for app in apps.values()]
    session = policy.SessionApps(selected=frozenset(app.pk for app in apps.values()))
    return apps, policy.AppIndex(plain), session


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("catalog_key", "method", "url", "action_key", "default_policy"),
    ROWS,
    ids=[f"{app}-{method}-{urlsplit(url).path}" for app, method, url, *_ in ROWS],
)
def test_a_real_request_is_its_cataloged_action_with_the_default_policy(
    catalog_apps, catalog_key, method, url, action_key, default_policy
):
    apps, index, session = catalog_apps
    decision = decide(index, session, method, url)
    assert decision.app.app_id == apps[catalog_key].pk
    assert [action.key for action in decision.actions] == [action_key]
    assert decision.policy == default_policy
    assert decision.outcome == OUTCOME[default_policy]


@pytest.mark.django_db
def test_match_actions_on_a_policy_app_gives_the_same_action(github):
    app = selectors.policy_app(github)
    (action,) = policy.match_actions(app, "PUT", "/repos/acme/web/pulls/7/merge")
    assert (action.key, action.policy) == ("merge_pull_request", ASK)
    (action,) = policy.match_actions(app, "GET", "/repos/acme/web/traffic/views")
    assert (action.key, action.policy) == (UNCATALOGED, ASK)


def test_every_catalog_action_has_a_real_request_in_the_table():
    covered = {(app, key) for app, _, _, key, _ in ROWS}
    for app in load_catalog().values():
        for action in app.actions:
            assert (app.key, action.key) in covered, f"{app.key}: {action.key}"


def test_the_table_uses_the_catalogs_default_policies():
    catalog = load_catalog()
    for app, _, _, key, expected in ROWS:
        if key != UNCATALOGED:
            assert catalog[app].action(key).default_policy == expected, f"{app}: {key}"


@pytest.mark.django_db
def test_requests_outside_an_apps_base_path_or_host_are_not_that_app(catalog_apps):
    _, index, session = catalog_apps
    assert decide(index, session, "GET", "https://slack.com/intl/en-gb/").outcome == "forward"
    assert decide(index, session, "GET", "https://github.com/acme/web").reason == "no_app"
    assert decide(index, session, "GET", "https://atlassian.net/").reason == "no_app"


@pytest.mark.django_db
def test_a_github_enterprise_base_path_keeps_the_same_actions(org):
    app = services.app_enable_builtin(
        organization=org, catalog_key="github", url_patterns=["https://git.acme.test/api/v3"]
    )
    index = policy.AppIndex([selectors.policy_app(app)])
    session = policy.SessionApps(selected=frozenset({app.pk}))
    decision = decide(index, session, "DELETE", "https://git.acme.test/api/v3/repos/acme/web")
    assert [a.key for a in decision.actions] == ["delete_repository"]
    assert decision.outcome == policy.REFUSE


@pytest.mark.django_db
def test_a_changed_policy_is_what_the_proxy_applies(github):
    services.app_set_action_policy(app=github, key="delete_repository", policy=ASK)
    index = policy.AppIndex([selectors.policy_app(github)])
    session = policy.SessionApps(selected=frozenset({github.pk}))
    decision = decide(index, session, "DELETE", f"{GH}/repos/acme/web")
    assert (decision.policy, decision.outcome) == (ASK, policy.PARK)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "url",
    [
        f"{SLACK}/./chat.delete",
        f"{SLACK}//chat.delete",
        "https://slack.com/api%2fchat.delete",
        "https://slack.com/x/../api/chat.delete",
        "https://git.acme.test/api/v3/repos/acme/web/./",
    ],
)
def test_a_non_canonical_path_is_refused_even_under_a_base_path(org, catalog_apps, url):
    apps, _, session = catalog_apps
    ghe = services.app_create_custom(
        organization=org, name="GHE", url_patterns=["https://git.acme.test/api/v3"]
    )
    index = policy.AppIndex(
        [*(selectors.policy_app(a) for a in apps.values()), selectors.policy_app(ghe)]
    )
    decision = decide(index, session, "POST", url)
    assert (decision.outcome, decision.reason) == (policy.REFUSE, "apps.noncanonical_path")
