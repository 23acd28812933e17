"""An existing deployment of the released main upgrades with `migrate` alone: its
database (schema and rows), its Celery task names and its table names carry over.

The released main is commit 560509d. Its migrations, task names and tables are written
out here rather than read from git, so that the tests run from any checkout."""

import datetime as dt
import fnmatch
import io

import pytest
from django.apps import apps as current_apps
from django.conf import settings
from django.contrib.auth.hashers import PBKDF2PasswordHasher, check_password
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.loader import MigrationLoader
from django.utils import timezone

# The newest migration of each of Quor's apps at commit 560509d (the released main):
# `git ls-tree -r 560509d --name-only | grep migrations`.
RELEASED_SCHEMA = [
    ("quor", "0004_file_store_identity"),
    ("sandboxes", "0010_workspace_kept"),
    ("integrations", "0001_initial"),
    ("approvals", "0003_alter_approvalrequest_url"),
    ("webapps", "0001_initial"),
    ("egress", "0001_initial"),
]

# Other apps with migrations that 560509d installed. Their migrations come with the
# packages (requirements.lock), not with Quor's code: they stay at their newest.
RELEASED_THIRD_PARTY_APPS = {"admin", "auth", "contenttypes", "sessions", "django_celery_beat"}

# Every Celery task 560509d registered (`git grep -n shared_task 560509d`: all are plain
# @shared_task in <app>/tasks.py, so named `<module>.<function>`), and the queue its
# CELERY_TASK_ROUTES sent it to. Production runs one worker per queue (README), so a task
# routed elsewhere would wait for a worker that never comes.
RELEASED_TASK_QUEUES = {
    "approvals.tasks.expire_stale_approvals": "default",
    "egress.tasks.delete_old_egress_decisions": "default",
    "quor.tasks.delete_orphaned_blobs": "default",
    "sandboxes.tasks.ensure_sandbox": "sandboxes",
    "sandboxes.tasks.sleep_idle_sandboxes": "sandboxes",
    "sandboxes.tasks.sleep_sandbox": "sandboxes",
    "sandboxes.tasks.reconcile_sandboxes": "sandboxes",
    "sandboxes.tasks.run_agent_turn": "agents",
    "sandboxes.tasks.requeue_pending_turns": "sandboxes",
    "sandboxes.tasks.fail_lost_turns": "sandboxes",
    "sandboxes.tasks.run_scheduled_tasks": "sandboxes",
}

# CELERY_BEAT_SCHEDULE at 560509d. The DatabaseScheduler stores each entry as a
# PeriodicTask row under its name and never removes one: an entry renamed or dropped
# would keep running from the deployment's database (twice, if renamed).
RELEASED_BEAT_SCHEDULE = {
    "sleep-idle-sandboxes": "sandboxes.tasks.sleep_idle_sandboxes",
    "reconcile-sandboxes": "sandboxes.tasks.reconcile_sandboxes",
    "requeue-pending-turns": "sandboxes.tasks.requeue_pending_turns",
    "fail-lost-turns": "sandboxes.tasks.fail_lost_turns",
    "run-scheduled-tasks": "sandboxes.tasks.run_scheduled_tasks",
    "expire-stale-approvals": "approvals.tasks.expire_stale_approvals",
    "delete-old-egress-decisions": "egress.tasks.delete_old_egress_decisions",
    "delete-orphaned-blobs": "quor.tasks.delete_orphaned_blobs",
}

# The table of every model of Quor's apps at 560509d, many-to-many tables included.
RELEASED_TABLES = {
    ("approvals", "approvalrequest"): "approvals_approvalrequest",
    ("approvals", "sessiongrant"): "approvals_sessiongrant",
    ("egress", "egressdecision"): "egress_egressdecision",
    ("egress", "egressdomainrule"): "egress_egressdomainrule",
    ("integrations", "app"): "integrations_app",
    ("integrations", "appaction"): "integrations_appaction",
    ("integrations", "appcredential"): "integrations_appcredential",
    ("quor", "apitoken"): "quor_apitoken",
    ("quor", "filestoreidentity"): "quor_filestoreidentity",
    ("quor", "membership"): "quor_membership",
    ("quor", "modelprovider"): "quor_modelprovider",
    ("quor", "modelprovider_allowed_groups"): "quor_modelprovider_allowed_groups",
    ("quor", "modelprovider_allowed_users"): "quor_modelprovider_allowed_users",
    ("quor", "organization"): "quor_organization",
    ("quor", "storedblob"): "quor_storedblob",
    ("quor", "user"): "quor_user",
    ("quor", "user_groups"): "quor_user_groups",
    ("quor", "user_user_permissions"): "quor_user_user_permissions",
    ("sandboxes", "agentevent"): "sandboxes_agentevent",
    ("sandboxes", "attachment"): "sandboxes_attachment",
    ("sandboxes", "libraryfile"): "sandboxes_libraryfile",
    ("sandboxes", "sandbox"): "sandboxes_sandbox",
    ("sandboxes", "scheduledrun"): "sandboxes_scheduledrun",
    ("sandboxes", "scheduledtask"): "sandboxes_scheduledtask",
    ("sandboxes", "scheduledtask_apps"): "sandboxes_scheduledtask_apps",
    ("sandboxes", "scheduledtask_preapproved_apps"): "sandboxes_scheduledtask_preapproved_apps",
    ("sandboxes", "session"): "sandboxes_session",
    ("sandboxes", "session_apps"): "sandboxes_session_apps",
    ("sandboxes", "skill"): "sandboxes_skill",
    ("sandboxes", "snapshot"): "sandboxes_snapshot",
    ("sandboxes", "workspacereset"): "sandboxes_workspacereset",
    ("webapps", "webapp"): "webapps_webapp",
}

PASSWORD = "released-main-password-1234"


def released_targets(graph) -> list[tuple[str, str | None]]:
    """The migration targets of a database of the released main: Quor's apps at
    RELEASED_SCHEMA, the packages' apps at their newest, any app added since unapplied."""
    targets = dict(RELEASED_SCHEMA)
    for label, name in sorted(graph.leaf_nodes()):
        if label in RELEASED_THIRD_PARTY_APPS:
            targets.setdefault(label, name)
        else:
            targets.setdefault(label, None)
    return list(targets.items())


def released_state_apps(loader):
    """The historical models of the released main's schema."""
    nodes = [target for target in released_targets(loader.graph) if target[1] is not None]
    return loader.project_state(nodes).apps


INTENDED_CHANGES = {
    # quor 0005: each organization's earliest admin becomes its owner.
    ("quor", "membership", "role"): {("admin", "owner")},
}


@pytest.mark.django_db(transaction=True)
def test_a_database_of_the_released_main_upgrades_with_migrate_alone():
    executor = MigrationExecutor(connection)
    try:
        executor.migrate(released_targets(executor.loader.graph))
        released_apps = released_state_apps(MigrationExecutor(connection).loader)
        insert_released_data(released_apps)
        released_rows = read_released_rows(released_apps)
    finally:
        # The upgrade, as a deployment runs it. Whatever happened above, the next test
        # finds the database at the latest schema (the flush after this test empties it).
        call_command("migrate", interactive=False, verbosity=0)

    upgraded = MigrationExecutor(connection)
    assert upgraded.migration_plan(upgraded.loader.graph.leaf_nodes()) == []

    # Every table of the released schema has rows, so that each is checked below.
    assert {key for key, rows in released_rows.items() if rows} == set(RELEASED_TABLES)
    # Every row is still there with every released column's value, read by the current
    # models (the same app label and model name).
    problems = {}
    for (label, model_name), rows in released_rows.items():
        model = current_apps.get_model(label, model_name)
        found = {obj.pk: obj for obj in model._base_manager.filter(pk__in=rows)}
        for pk, columns in rows.items():
            if pk not in found:
                problems[(label, model_name, pk)] = "lost"
                continue
            changed = {
                attname: (value, getattr(found[pk], attname))
                for attname, value in columns.items()
                if getattr(found[pk], attname) != value
                and (value, getattr(found[pk], attname))
                not in INTENDED_CHANGES.get((label, model_name, attname), ())
            }
            if changed:
                problems[(label, model_name, pk)] = changed
    assert problems == {}, "rows lost or changed by the upgrade, (before, after)"

    # Values only the current code can read: encrypted credentials and a password.
    User = current_apps.get_model("quor", "User")
    assert check_password(PASSWORD, User.objects.get(email="ada@acme-upgrade.test").password)
    ModelProvider = current_apps.get_model("quor", "ModelProvider")
    assert ModelProvider.objects.get().api_key == "sk-released-secret-do-not-leak"
    AppCredential = current_apps.get_model("integrations", "AppCredential")
    assert sorted(AppCredential.objects.values_list("secret", flat=True)) == [
        "ghp-organization-secret",
        "ghp-personal-secret",
    ]
    with connection.cursor() as cursor:
        cursor.execute("SELECT api_key FROM quor_modelprovider")
        assert "sk-released-secret" not in str(cursor.fetchone()[0])

    # The beat schedule the released deployment stored names tasks that still exist.
    PeriodicTask = current_apps.get_model("django_celery_beat", "PeriodicTask")
    stored = dict(PeriodicTask.objects.values_list("name", "task"))
    assert stored == RELEASED_BEAT_SCHEDULE
    registered = registered_task_names()
    assert {task for task in stored.values() if task not in registered} == set()

    output = io.StringIO()
    try:
        call_command("makemigrations", check=True, dry_run=True, stdout=output, verbosity=1)
    except SystemExit:
        pytest.fail(f"the models have changes without a migration:\n{output.getvalue()}")


def insert_released_data(apps) -> None:
    """Rows in every table of the released schema, through its historical models."""

    def new(model, **fields):
        return apps.get_model(model).objects.create(**fields)

    now = timezone.now()
    org = new(
        "quor.Organization",
        name="Acme Upgrade",
        slug="acme-upgrade",
        sandbox_enabled=True,
        workspace_instructions="Answer in French.",
    )
    group = new("auth.Group", name="Analysts")
    content_type, _ = apps.get_model("contenttypes.ContentType").objects.get_or_create(
        app_label="sandboxes", model="session"
    )
    permission, _ = apps.get_model("auth.Permission").objects.get_or_create(
        content_type=content_type, codename="view_session", defaults={"name": "Can view session"}
    )
    user = new(
        "quor.User",
        email="ada@acme-upgrade.test",
        # A hash of fewer iterations than today's, as an older deployment holds (and
        # quicker to check).
        password=PBKDF2PasswordHasher().encode(PASSWORD, "releasedsalt", iterations=1000),
        full_name="Ada Lovelace",
        is_staff=True,
        date_joined=now - dt.timedelta(days=30),
    )
    user.groups.add(group)
    user.user_permissions.add(permission)
    colleague = new("quor.User", email="bob@acme-upgrade.test", password="!unusable")
    new("quor.Membership", user=user, organization=org, role="admin")
    new("quor.Membership", user=colleague, organization=org, role="member", can_use_sandbox=False)
    provider = new(
        "quor.ModelProvider",
        organization=org,
        kind="anthropic",
        display_name="Anthropic (team)",
        base_url="https://provider.test:18443",
        api_key="sk-released-secret-do-not-leak",
        model_names=["claude-test", "claude-small"],
        available_to_everyone=False,
    )
    provider.allowed_users.add(user)
    provider.allowed_groups.add(group)
    new(
        "quor.ApiToken",
        user=user,
        name="laptop",
        prefix="quor_ab12",
        token_hash="a" * 64,
        last_used_at=now,
    )
    new("quor.FileStoreIdentity", marker="f" * 32, location="/var/lib/quor/files")
    snapshot_blob, attachment_blob, skill_blob, library_blob = (
        new("quor.StoredBlob", key=f"blobs/{name}", size=size, sha256=name[0] * 64)
        for name, size in (("snapshot", 4096), ("attachment", 17), ("skill", 512), ("library", 9))
    )

    sandbox = new(
        "sandboxes.Sandbox",
        user=user,
        image_ref="sha256:" + "c" * 64,
        state="sleeping",
        network_policy="restricted",
        network_address="10.232.0.7",
        runtime_credential="runtime-secret",
        runtime_credential_hash="b" * 64,
        has_workspace=True,
        last_activity_at=now - dt.timedelta(hours=2),
    )
    new(
        "sandboxes.Snapshot",
        sandbox=sandbox,
        blob=snapshot_blob,
        size=4096,
        sha256="s" * 64,
        workspace_bytes=65536,
        image_ref="sha256:" + "c" * 64,
    )
    new(
        "sandboxes.WorkspaceReset",
        sandbox=sandbox,
        action="restored_older",
        actor=user,
        via="reconciliation",
        replaced="running",
    )
    github = new(
        "integrations.App",
        organization=org,
        catalog_key="github",
        name="GitHub",
        url_patterns=["https://api.github.com"],
        when_not_selected="deny",
    )
    intranet = new(
        "integrations.App",
        organization=org,
        name="Intranet",
        description="The company wiki.",
        url_patterns=["https://intranet.acme.test/api"],
        credential_style="header",
        credential_header="X-Api-Key",
    )
    new(
        "integrations.AppAction",
        app=github,
        key="issues.create",
        name="Create an issue",
        methods=["POST"],
        paths=["/repos/*/*/issues"],
        policy="ask",
    )
    new("integrations.AppCredential", app=github, secret="ghp-organization-secret")
    new("integrations.AppCredential", app=github, user=user, secret="ghp-personal-secret")

    session = new(
        "sandboxes.Session",
        owner=user,
        sandbox=sandbox,
        title="Quarterly report",
        model_provider=provider,
        model_name="claude-test",
        status="finished",
        sharing="organization",
        skills=["reports"],
        finished_at=now,
    )
    session.apps.add(github, intranet)
    for seq, kind, payload in (
        (1, "user_message", {"text": "Write the report."}),
        (2, "assistant_text", {"text": "Voici le rapport."}),
        (3, "turn_finished", {"usage": {"input_tokens": 1200, "output_tokens": 300}}),
    ):
        new("sandboxes.AgentEvent", session=session, seq=seq, kind=kind, payload=payload)
    new("sandboxes.Attachment", session=session, name="figures.csv", blob=attachment_blob)
    new(
        "sandboxes.Skill",
        organization=org,
        name="reports",
        description="Writes reports.",
        bundle=skill_blob,
    )
    new(
        "sandboxes.LibraryFile",
        owner=user,
        path="templates/report.md",
        blob=library_blob,
        sha256="l" * 64,
    )
    approval = new(
        "approvals.ApprovalRequest",
        session=session,
        app=github,
        app_name="GitHub",
        actions=[{"key": "issues.create", "name": "Create an issue", "policy": "ask"}],
        method="POST",
        url="https://api.github.com/repos/acme/site/issues?token=***",
        summary="Create an issue in acme/site",
        status="approved",
        decided_via="user",
        decided_by=user,
        expires_at=now + dt.timedelta(minutes=5),
        decided_at=now,
    )
    new(
        "approvals.SessionGrant",
        session=session,
        app=github,
        action_key="issues.create",
        approval=approval,
    )
    new("webapps.WebApp", session=session, port=8000, command="python -m http.server 8000")

    task = new(
        "sandboxes.ScheduledTask",
        owner=user,
        name="Morning digest",
        prompt="Summarise yesterday's issues.",
        cron="0 8 * * 1-5",
        timezone="Europe/Paris",
        model_provider=provider,
        model_name="claude-small",
        skills=["reports"],
        next_run_at=now + dt.timedelta(days=1),
    )
    task.apps.add(github, intranet)
    task.preapproved_apps.add(github)
    run_session = new(
        "sandboxes.Session",
        owner=user,
        sandbox=sandbox,
        title="Morning digest",
        model_provider=provider,
        model_name="claude-small",
        status="finished",
        finished_at=now - dt.timedelta(days=1),
    )
    new(
        "sandboxes.ScheduledRun",
        task=task,
        scheduled_for=now - dt.timedelta(days=1),
        session=run_session,
        status="finished",
        finished_at=now - dt.timedelta(days=1),
    )

    new(
        "egress.EgressDomainRule",
        organization=org,
        pattern="*.example.com",
        action="allow",
        note="Documentation",
    )
    new(
        "egress.EgressDecision",
        created_at=now,
        sandbox_id=sandbox.pk,
        session_id=session.pk,
        client_address="10.232.0.7",
        method="POST",
        host="api.github.com",
        port=443,
        path="/repos/acme/site/issues?token=***",
        outcome="injected",
        reason="GitHub: Create an issue (approved)",
        addresses=["140.82.112.6"],
        credential_kind="app",
    )

    # What the released beat (DatabaseScheduler) stored of CELERY_BEAT_SCHEDULE.
    interval = new("django_celery_beat.IntervalSchedule", every=60, period="seconds")
    for name, task_name in RELEASED_BEAT_SCHEDULE.items():
        new("django_celery_beat.PeriodicTask", name=name, task=task_name, interval=interval)


def read_released_rows(apps) -> dict[tuple[str, str], dict]:
    """Every row of every table of Quor's apps in the released schema, as read back
    from the database: {(app label, model): {pk: {column attribute: value}}}."""
    labels = {label for label, _ in RELEASED_SCHEMA}
    rows = {}
    for model in apps.get_models(include_auto_created=True):
        if model._meta.app_label not in labels:
            continue
        columns = [field.attname for field in model._meta.concrete_fields]
        rows[(model._meta.app_label, model._meta.model_name)] = {
            obj.pk: {attname: getattr(obj, attname) for attname in columns}
            for obj in model._base_manager.all()
        }
    return rows


def registered_task_names() -> set[str]:
    """The tasks a worker of this code registers (a worker imports the same modules)."""
    from quor.celery import app

    app.loader.import_default_modules()
    return set(app.tasks)


def test_every_celery_task_of_the_released_main_is_still_registered_on_its_queue():
    from quor.celery import app

    registered = registered_task_names()
    assert {name for name in RELEASED_TASK_QUEUES if name not in registered} == set()
    queues = {name: app.amqp.router.route({}, name)["queue"].name for name in RELEASED_TASK_QUEUES}
    assert queues == RELEASED_TASK_QUEUES

    # Each beat entry names a registered task, and the released entries are all kept.
    schedule = settings.CELERY_BEAT_SCHEDULE
    unregistered = {
        name: entry["task"] for name, entry in schedule.items() if entry["task"] not in registered
    }
    assert unregistered == {}
    assert set(RELEASED_BEAT_SCHEDULE) - set(schedule) == set()

    # Each exact route names a registered task; a pattern matches at least one.
    for route in settings.CELERY_TASK_ROUTES:
        if "*" in route:
            assert fnmatch.filter(registered, route), route
        else:
            assert route in registered, route


def test_every_model_of_the_released_main_keeps_its_table():
    current = {
        key: current_apps.get_model(*key)._meta.db_table
        for key in RELEASED_TABLES
        if _has_model(*key)
    }
    assert current == RELEASED_TABLES

    # The constant is the released schema's own: its historical models have those tables.
    loader = MigrationLoader(None, ignore_no_migrations=True)
    released_apps = loader.project_state(RELEASED_SCHEMA).apps
    labels = {label for label, _ in RELEASED_SCHEMA}
    released = {
        (model._meta.app_label, model._meta.model_name): model._meta.db_table
        for model in released_apps.get_models(include_auto_created=True)
        if model._meta.app_label in labels
    }
    assert released == RELEASED_TABLES


def _has_model(label: str, model_name: str) -> bool:
    try:
        current_apps.get_model(label, model_name)
    except LookupError:
        return False
    return True
