import pytest
from django.core.management import call_command

from knowledge.checks import pgvector_problem


@pytest.mark.parametrize(
    ("version", "problem"),
    [
        (None, "no pgvector"),
        ("0.7.4", "0.7.4; Quor needs 0.8.0"),
        ("0.5.1", "0.5.1; Quor needs 0.8.0"),
        ("0.8.0", None),
        ("0.8.6", None),
        ("1.0.0", None),
        ("0.10.0", None),
    ],
)
def test_a_pgvector_older_than_0_8_is_refused(version, problem):
    found = pgvector_problem(version)
    if problem is None:
        assert found is None
    else:
        assert problem in found


@pytest.mark.django_db
def test_the_project_database_passes_the_pgvector_check():
    call_command("check", "--database", "default", "--fail-level", "ERROR")
