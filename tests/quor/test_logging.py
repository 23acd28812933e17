"""Logs as JSON lines (QUOR_LOG_FORMAT=json) carry the request id of the HTTP request or
the id of the Celery task they were written for, and never a query value, a credential
or a token-like string, in either format."""

import http.client
import io
import json
import logging
import re
import sys
import time
import uuid

import pytest

from quor.celery import app
from quor.lib import logs
from tests.docker_helpers import wait_for_http, wait_for_port
from tests.environment import free_port
from tests.quor.running import (
    Processes,
    celery_worker,
    json_lines,
    web,
)

SECRET = "s3cr3t-do-not-log"


@pytest.fixture
def processes(process_env, tmp_path):
    running = Processes(process_env, tmp_path)
    yield running
    running.stop_all()


def test_a_safe_request_id_comes_back_and_any_other_is_replaced_by_a_new_one(client):
    assert client.get("/healthz", HTTP_X_REQUEST_ID="lb-7f3a.2")["X-Request-ID"] == "lb-7f3a.2"
    for unsafe in ("<script>", "a b", "x" * 65, ""):
        replaced = client.get("/healthz", HTTP_X_REQUEST_ID=unsafe)["X-Request-ID"]
        assert re.fullmatch(r"[0-9a-f]{32}", replaced), unsafe
    assert client.get("/healthz")["X-Request-ID"] != client.get("/healthz")["X-Request-ID"]


def log_line(message: str, *args, exc_info=None) -> str:
    """What the handler of settings.LOGGING writes in JSON for one record."""
    output = io.StringIO()
    handler = logging.StreamHandler(output)
    handler.setFormatter(logs.JsonFormatter())
    handler.addFilter(logs.RedactSecrets())
    record = logging.LogRecord("quor.test", logging.WARNING, __file__, 1, message, args, exc_info)
    handler.handle(record)
    return output.getvalue()


def test_a_json_line_holds_no_query_value_credential_or_token():
    token = logs.request_id.set("req-1")
    try:
        raise ValueError(f"upstream said no to https://api.test/v1?key={SECRET}")
    except ValueError:
        line = log_line(
            "call %s with %s, proxy %s, %s",
            f"https://api.test/v1/items?q=1&access_token={SECRET}",
            {"HTTP_AUTHORIZATION": f"Bearer {SECRET}", "HTTP_COOKIE": f"sessionid={SECRET}"},
            f"http://sandbox:{SECRET}@10.231.0.1:8899",
            f"key sk-ant-{SECRET}-0123456789",
            exc_info=sys.exc_info(),
        )
    finally:
        logs.request_id.reset(token)

    assert SECRET not in line
    assert line.count("\n") == 1
    entry = json.loads(line)
    assert entry["request_id"] == "req-1"
    assert (entry["level"], entry["logger"]) == ("WARNING", "quor.test")
    assert "https://api.test/v1/items?q=***&access_token=***" in entry["message"]
    assert "'HTTP_AUTHORIZATION': 'Bearer ***'" in entry["message"]
    assert "'HTTP_COOKIE': '***'" in entry["message"]
    assert "http://***@10.231.0.1:8899" in entry["message"]
    assert "ValueError: upstream said no to https://api.test/v1?key=***" in entry["exception"]


@pytest.mark.django_db(transaction=True)
def test_the_web_process_writes_json_lines_with_the_request_id_and_without_query_values(
    processes,
):
    port = free_port()
    log = processes.start("web", web(port), QUOR_LOG_FORMAT="json", QUOR_LOG_LEVEL="INFO")
    # Its parent listens before its daphne processes have loaded Django: one must answer.
    wait_for_http(f"http://127.0.0.1:{port}/healthz")

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request(
        "GET",
        f"/api/v1/sessions/?token={SECRET}",
        headers={"Authorization": f"Bearer quor_pat_{SECRET}", "X-Request-ID": "req-42"},
    )
    response = connection.getresponse()
    assert (response.status, response.getheader("X-Request-ID")) == (401, "req-42")
    processes.stop_all()  # every line written

    lines = json_lines(log)
    assert len(lines) == len(log.read_text().splitlines())  # daphne's own lines are JSON too
    mine = [line for line in lines if line.get("request_id") == "req-42"]
    assert [(line["logger"], line["level"]) for line in mine] == [
        ("quor.access", "INFO"),
        ("django.request", "WARNING"),
    ]
    assert re.fullmatch(r"GET /api/v1/sessions/ 401 \d+ms", mine[0]["message"])
    assert mine[1]["message"] == "Unauthorized: /api/v1/sessions/"
    assert {"time", "level", "logger", "message"} <= lines[0].keys()
    assert SECRET not in log.read_text()


@pytest.mark.django_db(transaction=True)
def test_a_celery_task_logs_its_task_id_and_the_request_that_enqueued_it(processes):
    queue = f"logging-test-{uuid.uuid4().hex[:8]}"
    log = processes.start("worker", celery_worker(queue), QUOR_LOG_FORMAT="json")
    token = logs.request_id.set("req-7")
    try:
        traced = app.send_task("approvals.tasks.expire_stale_approvals", queue=queue)
    finally:
        logs.request_id.reset(token)
    untraced = app.send_task("approvals.tasks.expire_stale_approvals", queue=queue)

    def lines_of(task_id):
        deadline = time.monotonic() + 30
        while True:
            lines = [line for line in json_lines(log) if line.get("task_id") == task_id]
            if any("succeeded" in line["message"] for line in lines):
                return lines
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)

    assert {line.get("request_id") for line in lines_of(traced.id)} == {"req-7"}
    assert {line.get("request_id") for line in lines_of(untraced.id)} == {None}


def test_the_web_app_proxy_access_log_masks_query_values(processes):
    port = free_port()
    log = processes.start(
        "webapp-proxy",
        [sys.executable, "manage.py", "run_webapp_proxy", "--bind", f"127.0.0.1:{port}",
         "--access-log"],
        QUOR_LOG_FORMAT="json",
    )  # fmt: skip
    wait_for_port("127.0.0.1", port, log=log)
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("GET", f"/open?token={SECRET}", headers={"Host": "nothing.example"})
    assert connection.getresponse().status == 404
    processes.stop_all()

    access = [line for line in json_lines(log) if line["logger"] == "webapps.proxy"]
    assert access[-1]["message"] == "nothing.example GET /open?token=*** 404"
    assert SECRET not in log.read_text()
