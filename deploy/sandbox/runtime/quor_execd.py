"""Quor's exec channel: runs the control plane's commands in this sandbox without a new
container process per call (a `docker exec` costs ~40 ms of runc; this costs a fork).

Started by the entrypoint as the sandbox user, after the firewall is verified; the
firewall lets only the control plane open connections to it. One connection is one
command. Both sides first prove they hold this sandbox's token, which never crosses the
wire: the client sends HELLO and a nonce; the service answers a nonce of its own and
HMAC(token, "service" + both nonces); only if that is right does the client send the
request, one JSON line with HMAC(token, "client" + both nonces) as its proof:

    {"proof": ..., "argv": [...], "cwd": "/workspace", "env": {...}, "stdin": false}

So whatever else listens at an address the control plane once knew for this sandbox
(another sandbox since, whose code replaced its own service) learns nothing of the
request. Then, if "stdin", the command's stdin until the client shuts its side down.
Every answer is a frame, an 8-byte header (stream, length) and the data, as Docker's
exec stream: 0 "started" (empty), then 1 stdout and 2 stderr as they come, then 3 the
exit status (4 bytes, signed); or 4 a refusal (JSON) instead of "started", and nothing
runs.

The token is this sandbox's alone (the control plane derives it from the runtime's
name): it lets its holder run commands as the sandbox user here, which the sandbox user
can already do. Commands run in a session of their own (the control plane wraps them in
`timeout`, which kills their process group); the environment is the sandbox's own, the
request's added, the token taken out.
"""

import contextlib
import ctypes
import hashlib
import hmac
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

PORT = int(os.environ.get("QUOR_EXEC_PORT", "47100"))
TOKEN = os.environ.pop("QUOR_EXEC_TOKEN", "")
STARTED, STDOUT, STDERR, EXIT, REFUSED = 0, 1, 2, 3, 4
HELLO, NONCE_BYTES = b"QUOR1\n", 16
# How long a client may take to say hello and send its request; and what is left of a
# command's output read once it ended (what it left in the background may write on).
REQUEST_TIMEOUT_S, DRAIN_AFTER_EXIT_S, DRAIN_AFTER_EXIT_BYTES = 10, 2, 16 << 20
REQUEST_MAX_BYTES = 8 << 20  # above what a command line may hold (ARG_MAX)
READ_BYTES = 1 << 18
# The sandbox's environment as a `docker exec` sees it: not the entrypoint shell's own.
ENVIRONMENT = {
    name: value
    for name, value in os.environ.items()
    if name not in ("PWD", "OLDPWD", "SHLVL", "_", "XTABLES_LOCKFILE")
}


def frame(stream: int, data: bytes = b"") -> bytes:
    return struct.pack(">BxxxL", stream, len(data)) + data


def refuse(connection: socket.socket, code: str, message: str) -> None:
    connection.sendall(frame(REFUSED, json.dumps({"code": code, "message": message}).encode()))


def proof(key: bytes, side: bytes, nonces: bytes) -> str:
    return hmac.new(key, side + nonces, hashlib.sha256).hexdigest()


def read_request(reader) -> dict | None:
    line = reader.readline(REQUEST_MAX_BYTES + 1)
    if not line.endswith(b"\n"):
        return None
    try:
        request = json.loads(line)
    except ValueError:
        return None
    if not isinstance(request, dict):
        return None
    argv, env = request.get("argv"), request.get("env", {})
    if not (
        isinstance(argv, list)
        and argv
        and all(isinstance(a, str) for a in argv)
        and isinstance(request.get("cwd"), str)
        and isinstance(env, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
    ):
        return None
    return request


def pump_stdin(reader, process: subprocess.Popen) -> None:
    """The client's bytes to the command's stdin until the client shuts its side down."""
    try:
        while chunk := reader.read1(READ_BYTES):
            process.stdin.write(chunk)
    except OSError:
        pass  # the command closed its stdin, or the client left
    finally:
        with contextlib.suppress(OSError):
            process.stdin.close()


def send_output(connection: socket.socket, process: subprocess.Popen) -> None:
    """stdout and stderr as frames until the command has ended and its output is read:
    as under `docker exec`, what it left running in the background (and holding its
    output) does not hold the answer back. A client that left stops getting frames, and
    the command runs on."""
    connected = True
    pipes = {process.stdout.fileno(): STDOUT, process.stderr.fileno(): STDERR}

    def send(fd: int, data: bytes) -> None:
        nonlocal connected
        if connected:
            try:
                connection.sendall(frame(pipes[fd], data))
            except OSError:
                connected = False

    with selectors.DefaultSelector() as selector, open_pidfd(process.pid) as ended:
        for fd in pipes:
            selector.register(fd, selectors.EVENT_READ)
        selector.register(ended, selectors.EVENT_READ)
        while True:
            events = selector.select()
            if any(key.fd == ended for key, _ in events):
                break
            for key, _ in events:
                data = os.read(key.fd, READ_BYTES)
                if data:
                    send(key.fd, data)
                else:
                    selector.unregister(key.fd)
        deadline, budget = time.monotonic() + DRAIN_AFTER_EXIT_S, DRAIN_AFTER_EXIT_BYTES
        for fd in [key.fd for key in selector.get_map().values() if key.fd != ended]:
            os.set_blocking(fd, False)  # the command ended: what it wrote, and no more
            with contextlib.suppress(BlockingIOError):
                while budget > 0 and time.monotonic() < deadline:
                    data = os.read(fd, min(READ_BYTES, budget))
                    if not data:
                        break
                    budget -= len(data)
                    send(fd, data)
    process.stdout.close()
    process.stderr.close()


@contextlib.contextmanager
def open_pidfd(pid: int):
    """A descriptor that becomes readable when the process ends."""
    fd = os.pidfd_open(pid)
    try:
        yield fd
    finally:
        os.close(fd)


def exit_status(returncode: int) -> int:
    """A shell's numbering: 128 + the signal for a command a signal ended."""
    return 128 - returncode if returncode < 0 else returncode


def serve(connection: socket.socket) -> None:
    connection.settimeout(REQUEST_TIMEOUT_S)
    with connection, connection.makefile("rb") as reader:
        hello = reader.read(len(HELLO) + NONCE_BYTES)
        if len(hello) != len(HELLO) + NONCE_BYTES or not hello.startswith(HELLO):
            return
        nonces = hello[len(HELLO) :] + os.urandom(NONCE_BYTES)
        key = TOKEN.encode()
        connection.sendall(nonces[NONCE_BYTES:] + bytes.fromhex(proof(key, b"service", nonces)))
        request = read_request(reader)
        if request is None:
            refuse(connection, "bad_request", "not a request")
            return
        if not hmac.compare_digest(str(request.get("proof", "")), proof(key, b"client", nonces)):
            refuse(connection, "unauthorized", "wrong proof")
            return
        connection.settimeout(None)
        with_stdin = bool(request.get("stdin"))
        try:
            process = subprocess.Popen(  # noqa: S603  (argv from the control plane, no shell)
                request["argv"],
                cwd=request["cwd"],
                env={**ENVIRONMENT, **request["env"]},
                stdin=subprocess.PIPE if with_stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            connection.sendall(frame(STARTED) + frame(STDERR, f"{exc}\n".encode()))
            connection.sendall(frame(EXIT, struct.pack(">l", 127 if exc.errno == 2 else 126)))
            return
        connection.sendall(frame(STARTED))
        if with_stdin:
            threading.Thread(target=pump_stdin, args=(reader, process), daemon=True).start()
        send_output(connection, process)
        status = exit_status(process.wait())
        with contextlib.suppress(OSError):
            connection.sendall(frame(EXIT, struct.pack(">l", status)))


def serve_one(connection: socket.socket) -> None:
    try:
        serve(connection)
    except Exception as exc:  # one connection's trouble never stops the service
        print(f"quor-execd: {exc!r}", file=sys.stderr, flush=True)


def main() -> None:
    # Started in the background by a shell, which ignores these in its jobs: the
    # commands get them as under `docker exec`.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)
    if not TOKEN:  # a runtime created without one: Quor uses the runtime's own exec
        signal.pause()
    libc = ctypes.CDLL(None)
    libc.prctl(15, b"quor-execd", 0, 0, 0)  # PR_SET_NAME: not a "python3" to pkill
    # Every address: the firewall lets only the control plane connect.
    listener = socket.create_server(("0.0.0.0", PORT), backlog=128)  # noqa: S104
    while True:
        try:
            connection, _ = listener.accept()
        except OSError as exc:  # out of descriptors: later
            print(f"quor-execd: {exc!r}", file=sys.stderr, flush=True)
            time.sleep(0.1)
            continue
        try:
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=serve_one, args=(connection,), daemon=True).start()
        except (OSError, RuntimeError) as exc:  # out of threads (the pids limit): later
            connection.close()
            print(f"quor-execd: {exc!r}", file=sys.stderr, flush=True)
            time.sleep(0.1)


if __name__ == "__main__":
    main()
