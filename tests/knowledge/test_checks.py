import pytest
from django.core import checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from knowledge import checks as knowledge_checks
from knowledge.checks import pgvector_problem


@pytest.mark.parametrize(
    ("version", "problem"),
    [
        (None, "no pgvector"),
        ("0.7.4", "0.7.4; Quor needs 0.8.0"),
        ("0.5.1", "0.5.1; Quor needs 0.8.0"),
        ("0.7", "0.7; Quor needs 0.8.0"),
        ("unknown", "unknown; Quor needs 0.8.0"),
        ("0.8.0", None),
        ("0.8", None),
        ("0.8.0-dev", None),
        ("0.8.6", None),
        ("1.0", None),
        ("0.10.0", None),
    ],
)
def test_a_pgvector_older_than_0_8_is_refused(version, problem):
    found = pgvector_problem(version)
    if problem is None:
        assert found is None
    else:
        assert problem in found


def test_the_pgvector_check_runs_with_the_database_checks():
    assert knowledge_checks.check_pgvector in checks.registry.registry.get_checks(
        include_deployment_checks=False
    )


@pytest.mark.django_db
def test_the_project_database_passes_the_pgvector_check_and_an_old_one_would_not(monkeypatch):
    call_command("check", "--database", "default", "--fail-level", "ERROR")
    monkeypatch.setattr(knowledge_checks, "pgvector_problem", lambda version: f"old {version}")
    with pytest.raises(SystemCheckError, match=r"knowledge\.E001"):
        call_command("check", "--database", "default", "--fail-level", "ERROR")
