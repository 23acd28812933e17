"""Tasks are sent by name (quor/lib/tasks.py): every name sent is a registered task."""

import ast
from pathlib import Path

from django.apps import apps

from quor.celery import app

ROOT = Path(__file__).resolve().parents[2]


def names_sent_in_code() -> set[str]:
    names = set()
    for config in apps.get_app_configs():
        if Path(config.path).parent != ROOT:
            continue  # not one of Quor's own apps
        for path in Path(config.path).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name | ast.Attribute)
                    and getattr(node.func, "id", getattr(node.func, "attr", ""))
                    in ("send", "send_on_commit")
                    and node.args
                    and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[0].value, str)
                ):
                    names.add(node.args[0].value)
    return names


def test_every_task_sent_by_name_is_a_registered_task():
    app.loader.import_default_modules()  # registers every task, as a worker does at start
    sent = names_sent_in_code()

    assert {"sandboxes.tasks.run_agent_turn", "sandboxes.tasks.ensure_sandbox"} <= sent
    assert sent - set(app.tasks) == set()
