"""The exec journal: every exec is recorded before it runs, a retry with the same
Idempotency-Key gets the first run's result instead of a second run, and a run whose
process died says so."""

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from quor.lib.throttling import redis_client
from sandboxes.backends.base import RuntimeMissing
from sandboxes.backends.docker import DockerBackend
from sandboxes.models import ExecRecord
from sandboxes.runtime import journal
from tests import factories


def exec_url(session):
    return f"/api/v1/sessions/{session.pk}/exec/"


def journal_url(session, record_id=""):
    return f"/api/v1/sessions/{session.pk}/execs/" + (f"{record_id}/" if record_id else "")


def post_exec(api, session, argv, key=None, **fields):
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}
    return api.post(exec_url(session), {"argv": argv, **fields}, format="json", **headers)


def wait_for(condition, timeout=30.0, message="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {message}")


COUNT_RUNS = ["sh", "-c", "echo run >> runs.txt; wc -l < runs.txt"]


@pytest.fixture
def session(owner, running_sandbox):
    return factories.make_session(owner, title="journal")


@pytest.fixture
def api(client_for, owner):
    return client_for(owner)


@pytest.mark.docker
@pytest.mark.django_db
class TestRetries:
    def test_a_retry_with_the_same_key_gets_the_first_result_and_runs_nothing(self, api, session):
        first = post_exec(api, session, COUNT_RUNS, key="retry-1")
        again = post_exec(api, session, COUNT_RUNS, key="retry-1")

        assert first.status_code == again.status_code == 200
        assert first.json()["stdout"] == again.json()["stdout"] == "1\n"
        assert again.json()["id"] == first.json()["id"]
        assert again["Idempotent-Replayed"] == "true"
        assert "Idempotent-Replayed" not in first
        counted = post_exec(api, session, ["wc", "-l", "runs.txt"]).json()["stdout"]
        assert counted == "1 runs.txt\n"

    def test_without_a_key_every_request_runs(self, api, session):
        outputs = [post_exec(api, session, COUNT_RUNS).json()["stdout"] for _ in range(2)]
        assert outputs == ["1\n", "2\n"]
        assert ExecRecord.objects.filter(session=session, idempotency_key="").count() == 2

    def test_a_key_sent_with_another_request_is_refused_and_runs_nothing(self, api, session):
        post_exec(api, session, COUNT_RUNS, key="retry-2")
        other = post_exec(api, session, [*COUNT_RUNS[:2], "echo other >> runs.txt"], key="retry-2")

        assert other.status_code == 422
        assert other.json()["error"]["code"] == "exec.idempotency_key_reused"
        assert post_exec(api, session, ["cat", "runs.txt"]).json()["stdout"] == "run\n"
        assert ExecRecord.objects.filter(idempotency_key="retry-2").count() == 1

    def test_the_same_key_with_another_timeout_is_another_request(self, api, session):
        post_exec(api, session, ["true"], key="retry-3", timeout=10)
        other = post_exec(api, session, ["true"], key="retry-3", timeout=11)
        assert other.status_code == 422

    def test_keys_belong_to_their_user(self, api, client_for, colleague, session):
        post_exec(api, session, COUNT_RUNS, key="shared-key")
        theirs = factories.make_session(colleague, title="theirs")
        response = post_exec(client_for(colleague), theirs, ["echo", "mine"], key="shared-key")

        assert response.status_code == 200, response.content
        assert response.json()["stdout"] == "mine\n"

    @pytest.mark.parametrize("key", ["", " ", "with space", "x" * 256])
    def test_a_malformed_key_is_refused_before_anything_is_recorded(self, api, session, key):
        response = api.post(
            exec_url(session), {"argv": ["true"]}, format="json", HTTP_IDEMPOTENCY_KEY=key
        )
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "exec.invalid_idempotency_key"
        assert not ExecRecord.objects.exists()

    def test_a_run_that_never_started_is_started_by_its_retry(self, api, session, monkeypatch):
        def runtime_gone(self, *args, **kwargs):
            raise RuntimeMissing("the container is gone")

        with monkeypatch.context() as patched:
            patched.setattr(DockerBackend, "exec", runtime_gone)
            refused = post_exec(api, session, COUNT_RUNS, key="retry-4")
        assert refused.status_code == 503
        record = ExecRecord.objects.get(idempotency_key="retry-4")
        assert record.status == ExecRecord.Status.NOT_STARTED
        assert "stopped while the command was starting" in record.error

        retried = post_exec(api, session, COUNT_RUNS, key="retry-4")
        assert retried.status_code == 200
        assert retried.json()["stdout"] == "1\n"
        assert retried.json()["id"] == str(record.pk)
        record.refresh_from_db()
        assert record.status == ExecRecord.Status.FINISHED


@pytest.mark.docker
@pytest.mark.django_db(transaction=True)
def test_a_retry_while_the_first_run_works_gets_409_with_retry_after(
    api, session, client_for, owner
):
    first = {}

    def run_first():
        first["response"] = post_exec(client_for(owner), session, ["sleep", "3"], key="slow")

    thread = threading.Thread(target=run_first)
    thread.start()
    wait_for(lambda: ExecRecord.objects.filter(idempotency_key="slow").exists(), message="record")
    during = post_exec(api, session, ["sleep", "3"], key="slow")
    thread.join(timeout=60)

    assert during.status_code == 409
    assert during.json()["error"]["code"] == "exec.in_progress"
    assert during["Retry-After"] == "1"
    assert first["response"].status_code == 200
    after = post_exec(api, session, ["sleep", "3"], key="slow")
    assert after.status_code == 200
    assert after["Idempotent-Replayed"] == "true"


@pytest.mark.docker
@pytest.mark.django_db(transaction=True)
def test_a_process_killed_mid_exec_leaves_a_record_that_says_so(
    api, session, owner, process_env, docker_client, running_sandbox
):
    command = subprocess.Popen(
        [
            sys.executable, "manage.py", "sandbox_exec", owner.email,
            "--session", str(session.pk), "--idempotency-key", "killed", "--timeout", "30",
            "--", "sleep", "30",
        ],
        env=process_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        record = wait_for(
            lambda: ExecRecord.objects.filter(idempotency_key="killed").first(), message="record"
        )
        assert record.status == ExecRecord.Status.RUNNING
        assert record.via == ExecRecord.Via.COMMAND
        assert record.runner.split(":")[1] == str(command.pid)
        container = docker_client.containers.get(running_sandbox.runtime_id)
        wait_for(
            lambda: "sleep 30" in str(container.top()["Processes"]), message="the command running"
        )
    finally:
        os.kill(command.pid, signal.SIGKILL)
        command.wait(timeout=10)

    assert journal.execs_mark_interrupted() == 1
    record.refresh_from_db()
    assert record.status == ExecRecord.Status.INTERRUPTED
    assert "stopped before it finished" in record.error
    retried = post_exec(api, session, ["sleep", "30"], key="killed", timeout=30)
    assert retried.status_code == 409
    assert retried.json()["error"]["code"] == "exec.interrupted"
    assert post_exec(api, session, ["echo", "again"], key="new-key").json()["stdout"] == "again\n"


@pytest.mark.django_db
class TestInterruptedRuns:
    @pytest.fixture
    def record(self, owner):
        def make(runner, deadline_in_s=600):
            return ExecRecord.objects.create(
                organization=owner.membership.organization,
                user=owner,
                via=ExecRecord.Via.API,
                request_hash="0" * 64,
                argv=["true"],
                cwd="/workspace",
                timeout_s=10,
                runner=runner,
                started_at=timezone.now(),
                deadline=timezone.now() + timedelta(seconds=deadline_in_s),
            )

        return make

    def test_a_run_whose_runner_key_expired_is_interrupted(self, record):
        gone = record("elsewhere:4242:dead")
        alive = record("elsewhere:4243:live")
        redis_client().set(journal.RUNNER_KEY.format(alive.runner), "1", ex=30)

        assert journal.execs_mark_interrupted() == 1
        gone.refresh_from_db()
        alive.refresh_from_db()
        assert gone.status == ExecRecord.Status.INTERRUPTED
        assert alive.status == ExecRecord.Status.RUNNING

    def test_a_run_past_its_deadline_is_interrupted_even_if_its_runner_lives(self, record):
        late = record("elsewhere:4244:live", deadline_in_s=-1)
        redis_client().set(journal.RUNNER_KEY.format(late.runner), "1", ex=30)

        assert journal.execs_mark_interrupted() == 1
        late.refresh_from_db()
        assert late.status == ExecRecord.Status.INTERRUPTED

    def test_this_process_keeps_its_own_runs_alive(self, record):
        mine = record(journal.runner_name())
        assert journal.execs_mark_interrupted() == 0
        mine.refresh_from_db()
        assert mine.status == ExecRecord.Status.RUNNING

    def test_a_result_written_late_wins_over_interrupted(self, record):
        """Redis lost the key of a process that was still running the command."""
        from sandboxes.backends.base import ExecResult

        late = record("elsewhere:4245:lost-key")
        journal.execs_mark_interrupted()
        journal.exec_finished(late, ExecResult(0, b"ok\n", b"", False, False, False, 0.5))
        late.refresh_from_db()
        assert late.status == ExecRecord.Status.FINISHED
        assert bytes(late.stdout) == b"ok\n"

    def test_old_records_and_their_keys_go_after_the_retention_period(self, record, settings):
        settings.QUOR_EXEC_JOURNAL_RETENTION_DAYS = 1
        old = record("elsewhere:1:old")
        ExecRecord.objects.filter(pk=old.pk).update(started_at=timezone.now() - timedelta(days=2))
        kept = record("elsewhere:2:new")

        assert journal.exec_records_delete_old() == 1
        assert list(ExecRecord.objects.values_list("pk", flat=True)) == [kept.pk]


@pytest.mark.docker
@pytest.mark.django_db
class TestJournalApi:
    def test_the_journal_lists_runs_newest_first_and_one_run_with_its_output(self, api, session):
        post_exec(api, session, ["echo", "first"], env={"GREETING": "hello"})
        second = post_exec(api, session, ["sh", "-c", "echo oops >&2; exit 3"], key="k-2").json()

        listing = api.get(journal_url(session)).json()
        assert [r["argv"] for r in listing["results"]] == [
            ["sh", "-c", "echo oops >&2; exit 3"],
            ["echo", "first"],
        ]
        newest = listing["results"][0]
        assert newest["status"] == "finished"
        assert newest["exit_code"] == 3
        assert newest["idempotency_key"] == "k-2"
        assert "stdout" not in newest
        assert listing["results"][1]["env_names"] == ["GREETING"]
        assert "hello" not in str(listing)

        detail = api.get(journal_url(session, second["id"])).json()
        assert detail["stderr"] == "oops\n"
        assert detail["via"] == "api"

    def test_another_users_journal_and_runs_are_404(self, api, client_for, colleague, session):
        record_id = post_exec(api, session, ["true"]).json()["id"]
        other = client_for(colleague)
        assert other.get(journal_url(session)).status_code == 404
        assert other.get(journal_url(session, record_id)).status_code == 404

        theirs = factories.make_session(colleague, title="theirs")
        assert api.get(journal_url(theirs)).status_code == 404
        assert other.get(journal_url(theirs, record_id)).status_code == 404

    def test_an_auditor_reads_the_journal_in_the_admin_and_another_organization_does_not(
        self, api, session, client, stranger
    ):
        record_id = post_exec(api, session, ["echo", "audited"]).json()["id"]
        auditor = factories.make_user(session.owner.membership.organization, role="auditor")
        client.force_login(auditor)
        page = client.get(f"/admin/sandboxes/execrecord/{record_id}/change/")
        assert page.status_code == 200
        assert b"audited" in page.content

        client.force_login(stranger)
        assert client.get(f"/admin/sandboxes/execrecord/{record_id}/change/").status_code in (
            302,
            403,
        )
