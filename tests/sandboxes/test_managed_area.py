"""Skills and the User Library in a real sandbox: incremental sync and session links."""

import pytest

from sandboxes import skills
from sandboxes.library import files as library
from sandboxes.library.managed import sync_managed_area
from sandboxes.runtime import services
from sandboxes.sessions.services import agents_md
from tests import factories

pytestmark = [pytest.mark.docker, pytest.mark.django_db]


def test_skills_and_library_sync_incrementally_and_appear_in_the_session(
    running_sandbox, owner, org
):
    skill = skills.skill_create(
        organization=org, name="report", description="Writes the weekly report.",
        files={"SKILL.md": "# Report\\nRun make_report.py", "make_report.py": "print('report')"},
    )  # fmt: skip
    library.library_file_put(user=owner, path="notes/todo.txt", content=b"buy milk")
    session = factories.make_session(owner, skills=["report"])
    services.session_workspace_ensure(session=session)

    assert sync_managed_area(session=session) == {"copied": 3, "unchanged": 0, "removed": 0}
    assert sync_managed_area(session=session) == {"copied": 0, "unchanged": 3, "removed": 0}
    skills.skill_set_files(skill=skill, files={"SKILL.md": "# Report v2"})
    assert sync_managed_area(session=session) == {"copied": 1, "unchanged": 1, "removed": 1}

    ws = services.session_workspace(session)
    read = services.sandbox_exec(
        user=owner,
        session=session,
        argv=["cat", "skills/report/SKILL.md", "library/notes/todo.txt"],
    )
    assert read.stdout == b"# Report v2buy milk"
    assert (
        services.sandbox_exec(
            user=owner, argv=["test", "-e", f"{ws}/skills/report/make_report.py"]
        ).exit_code
        == 1
    )
    instructions = agents_md(session)
    assert "`skills/report/`: Writes the weekly report." in instructions
    assert "library/" in instructions
