"""Moving a workspace in and out of a sandbox as the sandbox user: the protocol every
backend shares.

A small Python script, started in the sandbox through the backend's exec (`Start`),
listens on a port of its own choosing, prints it, and takes one connection: the host's
(the sandbox's firewall accepts new connections only from the host), and only if it
begins with a token made for this transfer. It then becomes `tar`, reading or writing
that connection, so nothing is unpacked or packed as root and the bytes do not go through
the exec's stdio (Docker relays stdin at about 250 MB/s, half of what tar unpacks:
bench/snapshot.py). The host connects to the sandbox's address (RuntimeStatus.network_address).
"""

import contextlib
import secrets
import socket
from collections.abc import Iterable, Iterator

from sandboxes.backends.base import BackendError, UnreadableFiles
from sandboxes.backends.execution import STDERR, STDOUT, Start, with_timeout
from sandboxes.image import WORKSPACE

TRANSFER_TIMEOUT_S = 3600
CONNECT_TIMEOUT_S = 30
ERRORS_KEPT = 1 << 16

# The start of both scripts, run as the sandbox user in the sandbox: argv token, then
# theirs. Takes one connection from the host and checks the token.
_ACCEPT_ONE_CONNECTION = r"""
import os, socket, sys
token = sys.argv[1].encode()
listener = socket.create_server(("0.0.0.0", 0))
listener.settimeout(30)
print(listener.getsockname()[1], flush=True)
connection, _ = listener.accept()
listener.close()
connection.settimeout(30)
received = b""
while len(received) < len(token):
    piece = connection.recv(len(token) - len(received))
    if not piece:
        sys.exit("the sender left before its token")
    received += piece
if received != token:
    sys.exit("a connection without the token")
connection.settimeout(None)
"""


def _connected_tar(stdio: int, tar: str) -> str:
    """The script that accepts the host's connection, then runs `tar` (a shell command
    over "$1", "$2", ...: the arguments after the token) with that connection as its
    stdin (0) or stdout (1). tar's errors go to a file and only the last of them to
    stderr, which nobody reads while the transfer runs."""
    command = (
        f"{tar} 2>/tmp/.quor-tar.err; status=$?; tail -c 2000 /tmp/.quor-tar.err >&2; exit $status"
    )
    return _ACCEPT_ONE_CONNECTION + (
        f"os.dup2(connection.fileno(), {stdio})\n"
        f'os.execvp("sh", ["sh", "-c", {command!r}, "sh", *sys.argv[2:]])\n'
    )


# Arguments: token, workspace.
RECEIVE_AND_UNPACK = _connected_tar(0, 'tar -x -p --no-same-owner -C "$1" -f -')
# Arguments: token, workspace, the top-level name left out.
SEND_ARCHIVE = _connected_tar(1, 'tar -c --anchored --exclude="./$2" -C "$1" -f - .')


def tar_failed(exit_code: int, stderr: bytes) -> BackendError:
    """tar's own last words, for the operator."""
    problem = stderr.decode(errors="replace").strip()[-500:]
    return BackendError(f"tar in the sandbox failed (exit {exit_code}): {problem}")


def unreadable_if_denied(error: BackendError) -> BackendError:
    """A failed archive by the sandbox user is UnreadableFiles when it could not read
    some file: only the runtime's own archive can hold it."""
    return UnreadableFiles(str(error)) if "Permission denied" in str(error) else error


def send_workspace(start: Start, address: str, *, excluded: str) -> Iterator[bytes]:
    """SandboxBackend.export_workspace_as_sandbox_user: the workspace without `excluded`
    as an uncompressed tar stream. Raises UnreadableFiles or BackendError at the end."""
    try:
        with connected(start, address, SEND_ARCHIVE, WORKSPACE, excluded) as connection:
            while chunk := connection.recv(1 << 20, socket.MSG_WAITALL):
                yield chunk
    except BackendError as exc:
        if "Permission denied" in str(exc):
            raise unreadable_if_denied(exc) from exc
        raise


def receive_workspace(start: Start, address: str, tar_stream: Iterable[bytes]) -> None:
    """SandboxBackend.import_workspace: unpacked by tar as the sandbox user, modes kept."""
    with connected(start, address, RECEIVE_AND_UNPACK, WORKSPACE) as connection:
        for chunk in tar_stream:
            connection.sendall(chunk)


@contextlib.contextmanager
def connected(start: Start, address: str, script: str, *args: str) -> Iterator[socket.socket]:
    """Runs `script` (Python) as the sandbox user with a new token and `args`; it
    prints the port it listens on, takes one connection and only with that token, then
    becomes `tar`. Yields the connection; raises BackendError with tar's errors if it
    fails."""
    token = secrets.token_hex(16)
    argv = with_timeout(["python3", "-c", script, token, *args], TRANSFER_TIMEOUT_S)
    execution = start(argv, cwd=WORKSPACE, env={}, stdin=False)
    output = {STDOUT: bytearray(), STDERR: bytearray()}
    broken = None
    port = ""
    try:
        frames = execution.output(TRANSFER_TIMEOUT_S + 10)
        port = first_line(frames, output)
        if port.isdigit():
            try:
                with socket.create_connection(
                    (address, int(port)), timeout=CONNECT_TIMEOUT_S
                ) as connection:
                    connection.sendall(token.encode())
                    connection.settimeout(TRANSFER_TIMEOUT_S)
                    yield connection
            except OSError as exc:  # tar stopped (its errors follow) or is unreachable
                broken = exc
        for stream, data in frames:
            buffer = output.get(stream)
            if buffer is not None and len(buffer) < ERRORS_KEPT:
                buffer.extend(data)
    finally:
        execution.close()
    exit_code = execution.exit_code()
    if exit_code != 0:
        raise tar_failed(exit_code, bytes(output[STDERR]))
    if broken is not None or not port.isdigit():
        raise BackendError(f"the workspace could not be transferred: {broken}")


def first_line(frames: Iterator[tuple[int, bytes]], output: dict[int, bytearray]) -> str:
    """The first line the command writes to stdout (stderr kept in `output`)."""
    line = bytearray()
    for stream, data in frames:
        if stream != STDOUT:
            output[STDERR].extend(data[: max(0, ERRORS_KEPT - len(output[STDERR]))])
            continue
        line.extend(data)
        if b"\n" in line:
            first, _, rest = bytes(line).partition(b"\n")
            output[STDOUT].extend(rest)
            return first.decode(errors="replace").strip()
    return ""
