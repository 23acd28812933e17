"""The README documents every setting, and its production section starts every process
Quor needs: workers that consume every Celery queue Quor uses, beat and both proxies."""

import ast
import re
import runpy
import shlex
from pathlib import Path

from django.apps import apps
from django.core.management import get_commands, load_command_class

from quor.celery import app

ROOT = Path(__file__).resolve().parents[2]


def test_every_environment_setting_is_documented_in_the_readme():
    settings_source = (ROOT / "quor/settings.py").read_text()
    names = set(re.findall(r'env(?:bool|int|list)?\("([A-Z_]+)"', settings_source))
    readme = (ROOT / "README.md").read_text()
    documented = set(re.findall(r"`([A-Z][A-Z_]+)`", readme))
    assert len(names) > 20
    assert names - documented == set()


def production_section() -> str:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("\n### Production\n")
    following = re.search(r"\n#{1,3} ", readme[start + 1 :])
    return readme[start : start + 1 + following.start()] if following else readme[start:]


def production_commands() -> list[list[str]]:
    """The Command column of the production section's process table, split as a shell
    would split it."""
    rows = [line.strip().strip("|") for line in production_section().splitlines()]
    rows = [row.split("|") for row in rows if row.count("|") >= 2]
    column = [cell.strip() for cell in rows[0]].index("Command")
    return [shlex.split(row[column].strip().strip("`")) for row in rows[2:]]


def program(argv: list[str]) -> list[str]:
    """The command without the directory of its program (tools/run-dev gives .venv paths)
    and without `python` in front of manage.py."""
    words = [Path(argv[0]).name, *argv[1:]]
    return words[1:] if words[0] == "python" else words


def worker_queues(argv: list[str]) -> set[str]:
    """The queues a Celery worker command consumes (the default queue without -Q)."""
    words = program(argv)
    if words[:4] != ["celery", "-A", "quor", "worker"]:
        return set()
    for index, word in enumerate(words):
        if word in ("-Q", "--queues"):
            return set(words[index + 1].split(","))
        if word.startswith("--queues="):
            return set(word.removeprefix("--queues=").split(","))
    return {app.conf.task_default_queue}


def queues_named_in_code() -> set[str]:
    """Queues passed by name in Quor's code: `.apply_async(queue="...")`, `.set(...)`,
    `send_task(...)`."""
    queues = set()
    for config in apps.get_app_configs():
        if Path(config.path).parent != ROOT:
            continue  # not one of Quor's own apps
        for path in Path(config.path).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call):
                    queues |= {
                        keyword.value.value
                        for keyword in node.keywords
                        if keyword.arg == "queue" and isinstance(keyword.value, ast.Constant)
                    }
    return queues


def queues_quor_uses() -> set[str]:
    """Every queue a message can be sent to, from the Celery app's configuration as
    loaded now: the routes, where each registered task goes, where each beat entry goes
    (its own options first), and queues named in the code."""
    app.loader.import_default_modules()  # registers every task, as a worker does at start
    tasks = [name for name in app.tasks if not name.startswith("celery.")]
    assert tasks, "no Quor task registered"
    router = app.amqp.router
    queues = {route["queue"] for route in app.conf.task_routes.values()}
    queues |= {router.route({}, name)["queue"].name for name in tasks}
    for entry in app.conf.beat_schedule.values():
        options = dict(entry.get("options", {}))
        queues.add(router.route(options, entry["task"])["queue"].name)
    return queues | queues_named_in_code()


def test_the_production_workers_consume_every_queue_quor_uses():
    consumed = set().union(*(worker_queues(argv) for argv in production_commands()))
    assert queues_quor_uses() - consumed == set()


def test_the_development_worker_consumes_every_queue_quor_uses():
    processes = runpy.run_path(str(ROOT / "tools/run-dev"))["PROCESSES"]  # main() not run
    consumed = set().union(*(worker_queues(argv) for argv in processes.values()))
    assert queues_quor_uses() - consumed == set()


def test_the_production_section_starts_every_kind_of_process():
    commands = [program(argv) for argv in production_commands()]
    kinds = {
        "migrate": ["manage.py", "migrate"],
        "web": ["manage.py", "serve_web"],
        "beat": ["celery", "-A", "quor", "beat"],
        "egress proxy": ["manage.py", "run_egress_proxy"],
        "web app proxy": ["manage.py", "run_webapp_proxy"],
    }
    listed = {kind for kind, start in kinds.items() for c in commands if c[: len(start)] == start}
    assert listed == set(kinds)
    assert any(worker_queues(argv) for argv in production_commands())


def test_the_production_manage_py_commands_exist_and_accept_their_arguments():
    for argv in production_commands():
        words = program(argv)
        if words[0] != "manage.py":
            continue
        command = load_command_class(get_commands()[words[1]], words[1])
        command.create_parser("manage.py", words[1]).parse_args(words[2:])
