"""The terminal shell's command markers as the web tier reads them from the PTY's output,
read by read (sandboxes/terminal/markers.py): pure, no sandbox."""

import base64

import pytest

from sandboxes.terminal.markers import (
    MAX_COMMAND_LINE,
    MAX_MARKER_BYTES,
    TRUNCATED,
    CommandEnded,
    CommandStarted,
    MarkerReader,
)


def b64(text: str) -> bytes:
    return base64.b64encode(text.encode())


def started(shell: str, number: int, line: str, cwd: str = "/workspace") -> bytes:
    entry = f"{number:5d}  {line}\n"
    return b"\x1b]6973;C;%s;%d;%s;%s\x07" % (shell.encode(), number, b64(entry), b64(cwd))


def ended(shell: str, status: int) -> bytes:
    return b"\x1b]6973;D;%s;%d\x07" % (shell.encode(), status)


STREAM = (
    b"\x1b[32msandbox@box\x1b[m$ echo one\r\n"
    + started("41", 1, "echo one")
    + "one ünïcode\r\n".encode()
    + ended("41", 0)
    + b"$ false\r\n"
    + started("41", 2, "false")
    + ended("41", 1)
)
EVENTS = [
    CommandStarted(shell_pid="41", line="echo one", cwd="/workspace"),
    CommandEnded(shell_pid="41", exit_code=0),
    CommandStarted(shell_pid="41", line="false", cwd="/workspace"),
    CommandEnded(shell_pid="41", exit_code=1),
]


def read_in_pieces(stream: bytes, cuts: list[int]) -> list:
    reader, events, previous = MarkerReader(), [], 0
    for cut in [*cuts, len(stream)]:
        events += reader.feed(stream[previous:cut])
        previous = cut
    return events


@pytest.mark.parametrize("cut", range(len(STREAM) + 1))
def test_a_marker_split_anywhere_across_two_reads_is_read_once(cut):
    assert read_in_pieces(STREAM, [cut]) == EVENTS


def test_a_stream_read_byte_by_byte_gives_the_same_events():
    assert read_in_pieces(STREAM, list(range(1, len(STREAM)))) == EVENTS


def test_a_command_the_shell_kept_out_of_its_history_has_no_command_line():
    # `history 1` is then the previous entry, not the number PROMPT_COMMAND expected.
    marker = b"\x1b]6973;C;41;3;%s;%s\x07" % (b64("    2  false\n"), b64("/w"))
    assert MarkerReader().feed(marker) == [CommandStarted(shell_pid="41", line=None, cwd="/w")]


@pytest.mark.parametrize(
    "noise",
    [
        b"\x1b]6973;D;41;0",  # no terminator: an escape sequence follows
        b"\x1b]6973;D;41;x\x07",  # not a number
        b"\x1b]6973;E;41;0\x07",  # not ours
        b"\x1b]6973;C;41\x07",
        b"\x1b]6973;D;41;0;9\x07",
        b"\x1b]6973;C;41;1;!!!!\x07",  # not base64: ends the marker unread
    ],
)
def test_what_is_not_a_marker_is_no_event_and_does_not_hide_the_next(noise):
    assert MarkerReader().feed(noise + ended("41", 0)) == [
        CommandEnded(shell_pid="41", exit_code=0)
    ]


def test_a_marker_past_the_bounds_is_cut_and_never_held_whole():
    huge = started("41", 1, "x" * 50_000, cwd="/" + "d" * 20_000)
    reader = MarkerReader()
    events = []
    for start in range(0, len(huge), 4096):
        events += reader.feed(huge[start : start + 4096])
        assert len(reader._held) <= MAX_MARKER_BYTES
    events += reader.feed(ended("41", 0))
    [command, end] = events
    assert len(command.line) == MAX_COMMAND_LINE and command.line.endswith(TRUNCATED)
    assert command.line.startswith("xxx") and len(command.cwd) <= MAX_COMMAND_LINE
    assert end == CommandEnded(shell_pid="41", exit_code=0)
