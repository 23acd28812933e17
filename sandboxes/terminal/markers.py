"""The terminal's shell reports each command it runs: bash shell integration, given in the
shell's environment at attach (bash imports PS0 and PROMPT_COMMAND from it), prints
OSC 133-style markers, and the web tier reads them from the PTY's output. Pure: bytes in,
events out; no Django.

    ESC ] 6973 ; C ; <shell pid> ; <history number expected> ; <base64 of `history 1`> ;
        <base64 of $PWD> BEL            before a command runs (PS0)
    ESC ] 6973 ; D ; <shell pid> ; <exit status> BEL
                                        at the next prompt (PROMPT_COMMAND)

The command line is the shell's own history entry, as the shell ran it (history
expansion done); a command the shell kept out of its history (HISTCONTROL=ignorespace,
`set +o history`) is reported without one. Nothing typed is read: a password typed at a
prompt that does not echo is read by the program asking, never by the shell's line
editor, and never reaches a marker. The sandbox writes these markers, so a program in it
can forge or suppress them: what a marker carries is bounded here, how many records it
makes by the caller (sandboxes/terminal/services.py).

tmux drops escape sequences it does not know, so the markers are wrapped for its
passthrough (`allow-passthrough`, set by sandboxes/image.py's attach command): tmux hands
the inner sequence, unwrapped, to the attached client, the web tier.
"""

import base64
import binascii
import re
from dataclasses import dataclass

PREFIX = b"\x1b]6973;"
TERMINATOR = 0x07  # BEL
# What a marker's payload may hold; any other byte ends it unread.
_PAYLOAD = re.compile(rb"[A-Za-z0-9+/=;-]*")
# A marker's payload is read up to this many bytes; the rest is skipped (a longer
# command line is cut, never buffered whole).
MAX_MARKER_BYTES = 12 * 1024
# A command line (and a working directory) is kept up to this many characters.
MAX_COMMAND_LINE = 4096
TRUNCATED = "…"

# The shell integration: `$$` is the shell's pid (a nested bash reports its own), and
# PROMPT_COMMAND notes the history number the next command gets, so that PS0 can tell
# a command the shell did not keep in its history (`history 1` is then an older one).
_WRAP_START = r"\ePtmux;\e\e]6973;"
_WRAP_END = r"\a\e\\"
PS0 = (
    _WRAP_START + "C;$$;${__quor_n};"
    "$(HISTTIMEFORMAT= builtin history 1 | base64 -w0);"
    '$(builtin printf %s "$PWD" | base64 -w0)' + _WRAP_END
)
PROMPT_COMMAND = (
    "__quor_s=$?; "
    f'builtin printf "{_WRAP_START}D;%s;%s{_WRAP_END}\\\\" "$$" "$__quor_s"; '
    "__quor_n=$HISTCMD"
)
SHELL_ENV = {"PS0": PS0, "PROMPT_COMMAND": PROMPT_COMMAND}

_HISTORY_ENTRY = re.compile(r"\s*(\d+)[* ] (.*?)\n?", re.S)
_NUMBER = re.compile(rb"\d{1,10}")


@dataclass(frozen=True)
class CommandStarted:
    shell_pid: str
    line: str | None  # None: the shell kept no history entry of it
    cwd: str


@dataclass(frozen=True)
class CommandEnded:
    shell_pid: str
    exit_code: int


class MarkerReader:
    """Finds the markers in a PTY's output, read by read: a marker split across reads is
    put together; at most MAX_MARKER_BYTES of one are ever held."""

    def __init__(self):
        self._held = b""  # the start of a marker prefix, or a marker's payload so far
        self._inside = False  # _held is a payload, not a prefix

    def feed(self, data: bytes) -> list[CommandStarted | CommandEnded]:
        payloads: list[bytes] = []
        if self._inside:
            rest = self._continue(data, payloads)
            if rest is None:
                return []
            data = rest
        else:
            data, self._held = self._held + data, b""
        position = 0
        while (start := data.find(PREFIX, position)) >= 0:
            body = start + len(PREFIX)
            end = _PAYLOAD.match(data, body).end()
            if end == len(data):
                self._inside, self._held = True, data[body : body + MAX_MARKER_BYTES]
                return _events(payloads)
            if data[end] == TERMINATOR:
                payloads.append(data[body : min(end, body + MAX_MARKER_BYTES)])
            position = end
        for size in range(min(len(PREFIX) - 1, len(data) - position), 0, -1):
            if data.endswith(PREFIX[:size]):
                self._held = data[-size:]
                break
        return _events(payloads)

    def _continue(self, data: bytes, payloads: list[bytes]) -> bytes | None:
        """The rest of a marker begun in an earlier read; what follows it, or None while
        it goes on."""
        end = _PAYLOAD.match(data).end()
        self._held += data[: max(0, min(end, MAX_MARKER_BYTES - len(self._held)))]
        if end == len(data):
            return None
        self._inside = False
        if data[end] == TERMINATOR:
            payloads.append(self._held)
            end += 1
        self._held = b""
        return data[end:]


def _events(payloads: list[bytes]) -> list[CommandStarted | CommandEnded]:
    return [event for payload in payloads if (event := parse(payload)) is not None]


def parse(payload: bytes) -> CommandStarted | CommandEnded | None:
    """A marker's payload (between the prefix and BEL) as an event; None when it is not
    one of ours."""
    fields = payload.split(b";")
    if len(fields) < 3 or not _NUMBER.fullmatch(fields[1]):
        return None
    shell = fields[1].decode()
    if fields[0] == b"D" and len(fields) == 3 and _NUMBER.fullmatch(fields[2]):
        return CommandEnded(shell_pid=shell, exit_code=int(fields[2]))
    if fields[0] != b"C" or not _NUMBER.fullmatch(fields[2]):
        return None
    history = _decoded(fields[3]) if len(fields) > 3 else ""
    entry = _HISTORY_ENTRY.fullmatch(history)
    line = None
    if entry and entry.group(1) == fields[2].decode():
        line = _bounded(entry.group(2))
    cwd = _bounded(_decoded(fields[4])) if len(fields) > 4 else ""
    return CommandStarted(shell_pid=shell, line=line, cwd=cwd)


def _decoded(field: bytes) -> str:
    """Base64 (cut at a whole group: a marker past MAX_MARKER_BYTES is) as text."""
    try:
        raw = base64.b64decode(field[: len(field) // 4 * 4], validate=True)
    except binascii.Error:
        return ""
    return raw.decode(errors="replace")


def _bounded(text: str) -> str:
    if len(text) <= MAX_COMMAND_LINE:
        return text
    return text[: MAX_COMMAND_LINE - len(TRUNCATED)] + TRUNCATED
