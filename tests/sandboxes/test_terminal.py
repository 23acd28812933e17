"""The session's terminal, from where its user and an attacker stand: a real WebSocket to
real daphne processes, a shell on a PTY in a real Docker sandbox, the recording read
back from the file store."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest
import websocket
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from egress.decisions import SESSION_PRINCIPAL_PREFIX
from quor.models import Membership, StoredBlob
from sandboxes import image
from sandboxes.backends import get_backend
from sandboxes.image import WORKSPACE
from sandboxes.models import ExecRecord, Sandbox, Session, TerminalOutput, TerminalRecording
from sandboxes.runtime import services
from sandboxes.sessions import services as sessions
from sandboxes.terminal import markers
from sandboxes.terminal import services as terminal
from tests import factories
from tests.docker_helpers import wait_for_port
from tests.environment import PORTS

pytestmark = [pytest.mark.docker, pytest.mark.django_db(transaction=True)]


def cookie_for(user) -> str:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}"


class Viewer:
    """A browser's side of the terminal: what it typed, everything it was shown."""

    def __init__(self, base_url: str, session, user, *, cols=80, rows=24, query=None):
        url = base_url.replace("http://", "ws://") + f"/ws/sessions/{session.pk}/terminal/"
        self.ws = websocket.create_connection(
            url + (query if query is not None else f"?cols={cols}&rows={rows}"),
            header=[f"Cookie: {cookie_for(user)}"],
            origin="http://localhost",
            timeout=30,
        )
        self.shown = b""
        self.close_frame = None
        self.reason = ""
        self.last_opcode = None

    def type(self, text: str) -> None:
        self.ws.send(json.dumps({"input": text}))

    def send(self, message: str) -> None:
        self.ws.send(message)

    def _next(self, deadline: float) -> None:
        self.ws.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            # Frame by frame, with no close sent back: the server may have dropped the
            # connection after its close while the test was busy (a sleep takes seconds).
            frame = self.ws.recv_frame()
        except websocket.WebSocketTimeoutException:
            return  # the caller's deadline says what was missing
        opcode, data = frame.opcode, frame.data
        if opcode == websocket.ABNF.OPCODE_CONT:
            opcode = self.last_opcode
        self.last_opcode = opcode
        if opcode == websocket.ABNF.OPCODE_CLOSE:
            code = int.from_bytes(data[:2], "big") if len(data) >= 2 else None
            self.close_frame = (code, self.reason)
        elif opcode == websocket.ABNF.OPCODE_BINARY:
            self.shown += data
        elif opcode == websocket.ABNF.OPCODE_TEXT:
            self.reason = json.loads(data)["closed"]

    def until(self, pattern: bytes, timeout: float = 60) -> re.Match:
        """Reads until what was shown matches `pattern` (a regex)."""
        deadline = time.monotonic() + timeout
        while not (found := re.search(pattern, self.shown)):
            assert self.close_frame is None, f"closed {self.close_frame}: {self.shown[-500:]!r}"
            assert time.monotonic() < deadline, f"never shown {pattern!r}: {self.shown[-500:]!r}"
            self._next(deadline)
        return found

    def closed(self, timeout: float = 60) -> tuple[int, str]:
        deadline = time.monotonic() + timeout
        while self.close_frame is None:
            assert time.monotonic() < deadline, "the terminal never closed"
            self._next(deadline)
        return self.close_frame

    def close(self) -> None:
        self.ws.close()


def eventually_shows(viewer, command: str, pattern: bytes, timeout: float = 30) -> None:
    """Sends `command` until its answer matches: a resize reaches the shell through
    tmux a moment after Docker resized the PTY."""
    deadline = time.monotonic() + timeout
    while True:
        assert time.monotonic() < deadline, f"never shown {pattern!r}: {viewer.shown[-300:]!r}"
        start = len(viewer.shown)
        viewer.type(command)
        try:
            viewer.until(pattern, timeout=1)
        except AssertionError:
            continue
        if re.search(pattern, viewer.shown[start:]):
            return


def wait_until(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.1)
    return value


@pytest.fixture
def session(owner, running_sandbox):
    return factories.make_session(owner, sandbox=running_sandbox, status=Session.Status.WAITING)


@pytest.fixture
def second_web(process_env):
    """Another web process, as after a redeploy or behind a load balancer."""
    process = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(PORTS.SECOND_WEB),
         "quor.asgi:application"],
        env=process_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    wait_for_port("127.0.0.1", PORTS.SECOND_WEB)
    yield f"http://127.0.0.1:{PORTS.SECOND_WEB}"
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def shell_lives(session) -> bool:
    sandbox = Sandbox.objects.get(pk=session.sandbox_id)
    result = get_backend(sandbox.backend).exec(
        sandbox.backend_sandbox_id,
        image.terminal_exists_argv(str(session.pk)),
        cwd=WORKSPACE,
        env={},
        timeout_s=10,
        output_limit=4096,
    )
    return result.exit_code == 0


def ended_recording(session) -> TerminalRecording:
    return wait_until(
        lambda: TerminalRecording.objects.filter(
            session=session, status=TerminalRecording.Status.ENDED
        ).first(),
        30,
        "the recording ended",
    )


def cast_of(recording) -> tuple[dict, list]:
    response = owner_download(recording)
    assert response.status_code == 200, response.status_code
    lines = b"".join(response.streaming_content).decode().splitlines()
    return json.loads(lines[0]), [json.loads(line) for line in lines[1:]]


def owner_download(recording, user=None):
    client = Client()
    client.force_login(user or recording.user)
    return client.get(
        reverse("session-terminal-recording", args=[recording.session_id, recording.pk])
    )


# --- the owner's shell --------------------------------------------------------------------


def test_the_owner_gets_a_shell_as_the_sandbox_user_with_the_sessions_identity(
    quor_web, owner, session
):
    viewer = Viewer(quor_web, session, owner, cols=400)  # the answer on one line
    viewer.type('echo "id=$(id -u) dir=$(pwd) proxy=$HTTP_PROXY"\r')
    found = viewer.until(rb"id=(\d+) dir=(/\S+) proxy=http://([^:]+):")
    assert found.group(1) == b"1000"
    assert found.group(2).decode() == services.session_workspace(session)
    assert found.group(3).decode() == f"{SESSION_PRINCIPAL_PREFIX}{session.pk}"
    viewer.close()
    record = wait_until(
        lambda: ExecRecord.objects.filter(
            session=session, via=ExecRecord.Via.TERMINAL, status=ExecRecord.Status.FINISHED
        ).first(),
        30,
        "the attachment's journal record finished",
    )
    assert record.user == owner
    assert record.argv[0] == "tmux"
    assert "HTTP_PROXY" in record.env_names


def test_the_shell_survives_a_reconnect_to_another_web_process(
    quor_web, second_web, owner, session
):
    first = Viewer(quor_web, session, owner)
    first.type("export REMEMBERED=kept$((20+1))\r")
    first.type("echo set-$((40+2))\r")
    first.until(rb"set-42")
    first.close()
    second = Viewer(second_web, session, owner)
    second.type("echo found-$REMEMBERED\r")
    second.until(rb"found-kept21")
    second.close()
    assert TerminalRecording.objects.filter(session=session).count() == 1


def test_a_new_connection_replaces_the_older_one(quor_web, owner, session):
    first = Viewer(quor_web, session, owner)
    first.type("echo first-$((1+1))\r")
    first.until(rb"first-2")
    second = Viewer(quor_web, session, owner)
    assert first.closed()[0] == 4409
    second.type("echo second-$((2+2))\r")
    second.until(rb"second-4")
    second.close()


def test_the_terminal_is_resizable(quor_web, owner, session):
    viewer = Viewer(quor_web, session, owner, cols=100, rows=30)
    ask = "echo size-$(stty size | tr ' ' x)\r"
    eventually_shows(viewer, ask, rb"size-30x100")
    viewer.send(json.dumps({"resize": [120, 40]}))
    eventually_shows(viewer, ask, rb"size-40x120")
    viewer.close()


# --- the commands its shell reports -------------------------------------------------------


def journal_as_auditor(org, attachment) -> list[ExecRecord]:
    """The attachment's commands as the organization's auditors read the exec journal:
    the admin's list, filtered by via and searched by the attachment's id; oldest first."""
    auditor = factories.make_user(org, role=Membership.Role.AUDITOR, email="au@acme.test")
    client = Client()
    client.force_login(auditor)
    response = client.get(
        reverse("admin:sandboxes_execrecord_changelist"),
        {"via__exact": ExecRecord.Via.SHELL, "q": str(attachment.pk), "all": ""},
    )
    assert response.status_code == 200
    return sorted(response.context["cl"].result_list, key=lambda record: record.started_at)


def shell_commands(session):
    return ExecRecord.objects.filter(session=session, via=ExecRecord.Via.SHELL)


def test_each_command_the_shell_runs_is_a_journal_record_of_the_attachment(
    quor_web, org, owner, session
):
    viewer = Viewer(quor_web, session, owner)
    for line in ("echo one", "false", "sleep 0.2 && echo two"):
        viewer.type(line + "\r")
    viewer.until(rb"(?<!echo )two")
    wait_until(
        lambda: shell_commands(session).filter(status=ExecRecord.Status.FINISHED).count() == 3,
        30,
        "the shell reported three commands ended",
    )
    attachment = ExecRecord.objects.get(session=session, via=ExecRecord.Via.TERMINAL)
    commands = journal_as_auditor(org, attachment)
    assert [(record.argv, record.exit_code) for record in commands] == [
        (["echo one"], 0),
        (["false"], 1),
        (["sleep 0.2 && echo two"], 0),
    ]
    for record in commands:
        assert record.attachment_id == attachment.pk and record.user == owner
        assert record.cwd == services.session_workspace(session)
        assert record.started_at <= record.finished_at
    # Times are when the web tier read the markers: near the shell's, not exact.
    assert commands[2].duration_s > 0.1
    viewer.close()


# A program in the sandbox forging markers (wrapped for tmux's passthrough, as the shell's
# are): one whose command line is far past the bound, then more than the bound of records.
FORGER = (
    "python3 -c 'import base64,sys; w=sys.stdout.buffer.write; "
    'm=lambda p: w(b"\\x1bPtmux;\\x1b\\x1b]6973;"+p+b"\\x07\\x1b\\\\"); '
    "h=lambda s: base64.b64encode(s.encode()); "
    'm(b"C;7;1;"+h("    1  "+"x"*30000)+b";"+h("/"+"d"*9000)); m(b"D;7;0"); '
    '[(m(b"C;7;1;"+h("    1  forged %d" % i)+b";L3RtcA=="), m(b"D;7;3")) for i in range(1200)]; '
    'w(b"forging "+b"done\\n")\'\r'
)


def test_forged_markers_journal_no_more_than_their_bounds(quor_web, owner, session):
    viewer = Viewer(quor_web, session, owner)
    viewer.type(FORGER)
    viewer.until(rb"forging done")
    viewer.type("echo after-$((1+1))\r")
    # Shown after all the forged markers, which are read before the next output is shown.
    viewer.until(rb"after-2")
    commands = shell_commands(session)
    assert commands.count() == terminal.MAX_COMMANDS_PER_ATTACHMENT
    assert not commands.filter(argv=["echo after-$((1+1))"]).exists()
    longest = max(len(line) for argv in commands.values_list("argv", flat=True) for line in argv)
    assert longest == markers.MAX_COMMAND_LINE
    forged = commands.get(argv__0__startswith="xxx")
    assert forged.argv[0].endswith(markers.TRUNCATED) and len(forged.cwd) <= 4096
    viewer.close()


# --- how it ends, and what stays of it ----------------------------------------------------


def test_exit_ends_it_and_the_recording_holds_everything_shown(quor_web, owner, session):
    viewer = Viewer(quor_web, session, owner, cols=90, rows=20)
    viewer.type("printf 'recorded-%s\\n' $((6*7))\r")
    viewer.until(rb"recorded-42")
    viewer.send(json.dumps({"resize": [100, 25]}))
    viewer.type("exit\r")
    code, reason = viewer.closed()
    assert (code, reason) == (4000, terminal.ENDED_BY_SHELL)
    recording = ended_recording(session)
    assert recording.cast is not None and recording.end_reason == terminal.ENDED_BY_SHELL
    assert not TerminalOutput.objects.filter(recording=recording).exists()
    header, events = cast_of(recording)
    assert header["version"] == 2 and header["width"] >= 1 and header["height"] >= 1
    assert isinstance(header["timestamp"], int)
    times = [event[0] for event in events]
    assert times == sorted(times)
    assert ["r", "100x25"] in [event[1:] for event in events]
    output = "".join(data for _, kind, data in events if kind == "o")
    # What the recording holds is what the browser was shown, byte for byte.
    assert output == viewer.shown.decode(errors="replace")
    assert "recorded-42" in output
    assert not shell_lives(session)


def test_cancelling_the_turn_ends_the_terminal(quor_web, owner, session):
    Session.objects.filter(pk=session.pk).update(status=Session.Status.RUNNING)
    session.refresh_from_db()
    viewer = Viewer(quor_web, session, owner)
    viewer.type("echo before-$((3*3))\r")
    viewer.until(rb"before-9")
    sessions.session_cancel(user=owner, session=session)
    assert viewer.closed() == (4000, terminal.ENDED_BY_CANCEL)
    assert ended_recording(session).end_reason == terminal.ENDED_BY_CANCEL
    assert not shell_lives(session)
    wait_until(
        lambda: (
            not ExecRecord.objects.filter(
                session=session, via=ExecRecord.Via.TERMINAL, status=ExecRecord.Status.RUNNING
            ).exists()
        ),
        30,
        "the journal record of the attachment finished",
    )


def test_the_sandbox_going_to_sleep_ends_the_terminal(quor_web, owner, session):
    viewer = Viewer(quor_web, session, owner)
    viewer.type("echo awake-$((5*5))\r")
    viewer.until(rb"awake-25")
    services.sandbox_sleep(sandbox=session.sandbox, force=True)
    assert viewer.closed() == (4000, terminal.ENDED_BY_SANDBOX)
    assert ended_recording(session).end_reason == terminal.ENDED_BY_SANDBOX


def test_a_recording_whose_viewer_left_is_finished_once_the_sandbox_sleeps(
    quor_web, owner, session
):
    viewer = Viewer(quor_web, session, owner)
    viewer.type("echo left-$((8*8))\r")
    viewer.until(rb"left-64")
    viewer.close()
    wait_until(
        lambda: ExecRecord.objects.filter(
            session=session, via=ExecRecord.Via.TERMINAL, status=ExecRecord.Status.FINISHED
        ).exists(),
        30,
        "the attachment ended (and found the shell alive)",
    )
    assert TerminalRecording.objects.get(session=session).status == "recording"
    services.sandbox_sleep(sandbox=session.sandbox, force=True)
    assert terminal.terminal_recordings_finish_stale() == 1
    _, events = cast_of(ended_recording(session))
    assert "left-64" in "".join(data for _, kind, data in events if kind == "o")


# --- from where an attacker stands ----------------------------------------------------------


@pytest.mark.parametrize("who", ["anonymous", "colleague", "org admin", "auditor", "stranger"])
def test_nobody_but_the_owner_opens_the_terminal(
    quor_web, owner, colleague, org_admin, stranger, org, session, who
):
    auditor = factories.make_user(org, role=Membership.Role.AUDITOR, email="auditor@acme.test")
    user = {
        "anonymous": None,
        "colleague": colleague,
        "org admin": org_admin,
        "auditor": auditor,
        "stranger": stranger,
    }[who]
    url = (
        quor_web.replace("http://", "ws://")
        + f"/ws/sessions/{session.pk}/terminal/?cols=80&rows=24"
    )
    header = [f"Cookie: {cookie_for(user)}"] if user else []
    with pytest.raises(websocket.WebSocketBadStatusException) as refused:
        websocket.create_connection(url, header=header, origin="http://localhost", timeout=30)
    assert refused.value.status_code == 403
    assert not TerminalRecording.objects.exists()
    assert not ExecRecord.objects.filter(via=ExecRecord.Via.TERMINAL).exists()


def test_a_page_of_another_origin_cannot_open_it(quor_web, owner, session):
    url = (
        quor_web.replace("http://", "ws://")
        + f"/ws/sessions/{session.pk}/terminal/?cols=80&rows=24"
    )
    with pytest.raises(websocket.WebSocketBadStatusException) as refused:
        websocket.create_connection(
            url, header=[f"Cookie: {cookie_for(owner)}"], origin="http://evil.test", timeout=30
        )
    assert refused.value.status_code == 403


@pytest.mark.parametrize(
    ("message", "code"),
    [
        (json.dumps({"input": "x" * (70 * 1024)}), 4413),
        (json.dumps({"resize": [100000, 10]}), 4400),
        (json.dumps({"resize": "big"}), 4400),
        (json.dumps(["input", "ls"]), 4400),
        ("not json", 4400),
    ],
    ids=["oversized input", "huge resize", "malformed resize", "not an object", "not json"],
)
def test_bad_messages_close_the_socket_and_the_shell_stays(quor_web, owner, session, message, code):
    viewer = Viewer(quor_web, session, owner)
    viewer.type("echo up-$((7+7))\r")
    viewer.until(rb"up-14")
    viewer.send(message)
    assert viewer.closed()[0] == code
    assert shell_lives(session)


@pytest.mark.parametrize("query", ["?cols=0&rows=24", "?cols=80&rows=100000", "?cols=a&rows=b", ""])
def test_a_size_out_of_bounds_is_refused_before_anything_starts(quor_web, owner, session, query):
    with pytest.raises(websocket.WebSocketBadStatusException):
        Viewer(quor_web, session, owner, query=query)
    assert not TerminalRecording.objects.exists()


def test_output_past_the_recording_limit_ends_the_terminal(quor_web, owner, session, settings):
    """The limit is read by the web processes at start: theirs is the default, so the
    recording's size is set near it instead."""
    viewer = Viewer(quor_web, session, owner)
    viewer.type("echo near-$((9*9))\r")
    viewer.until(rb"near-81")
    TerminalRecording.objects.filter(session=session).update(
        size=settings.QUOR_TERMINAL_RECORDING_MAX_BYTES
    )
    viewer.close()
    viewer = Viewer(quor_web, session, owner)  # tmux redraws the screen: output
    assert viewer.closed() == (4000, terminal.ENDED_BY_SIZE)
    assert ended_recording(session).end_reason == terminal.ENDED_BY_SIZE
    assert not shell_lives(session)


# --- the recordings: who reads them, how long they are kept --------------------------------


@pytest.fixture
def finished_recording(owner):
    """No sandbox needed: the recording's rows, finished into a file."""
    recording = TerminalRecording.objects.create(
        organization=owner.membership.organization,
        user=owner,
        session=factories.make_session(owner),
        width=80,
        height=24,
        started_at=timezone.now(),
    )
    TerminalOutput.objects.create(recording=recording, at=0.5, kind="o", data="hello\r\n")
    return terminal.terminal_recording_finish(recording_id=recording.pk, reason="test")


@pytest.mark.parametrize(
    ("who", "owner_url", "audit_url"),
    [
        ("owner", 200, 403),
        ("colleague", 404, 403),
        ("org admin", 404, 200),
        ("auditor", 403, 200),
        ("stranger auditor", 403, 404),
    ],
)
def test_the_owner_and_the_organizations_auditors_download_a_recording(
    owner, colleague, org_admin, org, finished_recording, who, owner_url, audit_url
):
    globex = factories.make_org(name="Globex", slug="globex")
    user = {
        "owner": owner,
        "colleague": colleague,
        "org admin": org_admin,
        "auditor": factories.make_user(org, role=Membership.Role.AUDITOR, email="au@acme.test"),
        "stranger auditor": factories.make_user(
            globex, role=Membership.Role.AUDITOR, email="au@globex.test"
        ),
    }[who]
    client = Client()
    client.force_login(user)
    mine = client.get(
        reverse(
            "session-terminal-recording",
            args=[finished_recording.session_id, finished_recording.pk],
        )
    )
    audited = client.get(reverse("terminal-recording-audit", args=[finished_recording.pk]))
    assert (mine.status_code, audited.status_code) == (owner_url, audit_url)
    for response in (mine, audited):
        if response.status_code == 200:
            assert response["Content-Type"] == "application/x-asciicast"
            assert b'"hello\\r\\n"' in b"".join(response.streaming_content)


def test_recordings_are_deleted_with_their_files_after_the_retention(finished_recording, settings):
    settings.QUOR_TERMINAL_RECORDING_RETENTION_DAYS = 7
    blob_id = finished_recording.cast_id
    assert terminal.terminal_recordings_delete_old() == 0
    TerminalRecording.objects.filter(pk=finished_recording.pk).update(
        ended_at=timezone.now() - timedelta(days=8)
    )
    assert terminal.terminal_recordings_delete_old() == 1
    assert not TerminalRecording.objects.exists()
    assert not StoredBlob.objects.filter(pk=blob_id).exists()
