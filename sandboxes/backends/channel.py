"""Quor's exec channel: commands reach a sandbox through the service its entrypoint
starts (deploy/sandbox/runtime/quor_execd.py, the protocol is described there), not
through a new container process per call. A backend that has it tries it first and
falls back to its runtime's own exec when nothing listens (an older image, the agent
killed it) or the service refuses the token (an address now another sandbox's): in
both cases nothing was started, so the command never runs twice.

Only the control plane reaches the channel: the sandbox's firewall accepts new
connections from it alone. The token is derived from the runtime's name with Quor's
secret key, so it is the same after a restart and worth nothing in another sandbox. It
never crosses the wire: the service proves it holds it before the client sends the
request (so nothing reaches whatever listens at an address that is now another
sandbox's), and the client proves it in the request.
"""

import hashlib
import hmac
import json
import logging
import secrets
import socket
import struct
import time
from collections.abc import Callable, Iterable, Iterator

from django.utils.crypto import salted_hmac

from sandboxes.backends.base import BackendError, ExecResult
from sandboxes.backends.execution import (
    Execution,
    Start,
    read_exactly,
    read_frames,
    run_bounded,
    send_then_shut,
)
from sandboxes.image import EXEC_CHANNEL, EXEC_CHANNEL_PORT

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 2
# How long the service may take to prove itself and to start a command; past it the call
# fails rather than falling back, since the command may yet start.
ANSWER_TIMEOUT_S = 10
# How long the command may take to accept each piece of its stdin.
STDIN_TIMEOUT_S = 60
STARTED, EXIT, REFUSED = 0, 3, 4
HELLO, NONCE_BYTES = b"QUOR1\n", 16
# A channel found gone is started again through the runtime's own exec at most this often
# per runtime: something else on its port (the agent's own listener) makes that fail.
RESTART_EVERY_S = 30


class ChannelUnavailable(Exception):
    """Nothing was started: use the runtime's own exec."""


class NothingListens(ChannelUnavailable):
    """No service at the channel's address: it ended (the agent may have killed it)."""


def channel_token(runtime_name: str) -> str:
    return salted_hmac("quor.sandboxes.exec-channel", runtime_name, algorithm="sha256").hexdigest()


def proof(token: str, side: bytes, nonces: bytes) -> str:
    return hmac.new(token.encode(), side + nonces, hashlib.sha256).hexdigest()


def _check_service(sock: socket.socket, token: str) -> bytes:
    """Both nonces, once the service proved it holds the token; ChannelUnavailable (and
    nothing sent but a nonce) otherwise."""
    client_nonce = secrets.token_bytes(NONCE_BYTES)
    sock.sendall(HELLO + client_nonce)
    answer = read_exactly(sock, NONCE_BYTES + 32)
    if answer is None:
        raise ChannelUnavailable("the exec channel closed without an answer")
    nonces = client_nonce + answer[:NONCE_BYTES]
    if not hmac.compare_digest(answer[NONCE_BYTES:].hex(), proof(token, b"service", nonces)):
        raise ChannelUnavailable("what answers there is not this sandbox's exec channel")
    return nonces


def start_over_channel(
    address: str, token: str, argv: list[str], *, cwd: str, env: dict[str, str], stdin: bool
) -> Execution:
    try:
        sock = socket.create_connection((address, EXEC_CHANNEL_PORT), timeout=CONNECT_TIMEOUT_S)
    except OSError as exc:
        raise NothingListens(f"no exec channel at {address}: {exc}") from exc
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(ANSWER_TIMEOUT_S)
        nonces = _check_service(sock, token)
    except (ChannelUnavailable, OSError) as exc:  # nothing was sent but a nonce
        sock.close()
        if isinstance(exc, ChannelUnavailable):
            raise
        raise ChannelUnavailable(f"the exec channel did not prove itself: {exc}") from exc
    try:
        request = {"argv": argv, "cwd": cwd, "env": env, "stdin": stdin}
        request["proof"] = proof(token, b"client", nonces)
        sock.sendall(json.dumps(request).encode() + b"\n")
        header = read_exactly(sock, 8)
        if header is None:
            raise ChannelUnavailable("the exec channel closed without an answer")
        stream, size = struct.unpack(">BxxxL", header)
        if stream == REFUSED:
            refusal = json.loads(read_exactly(sock, size) or b"{}")
            if refusal.get("code") == "unauthorized":
                raise ChannelUnavailable("the exec channel refused this sandbox's proof")
            raise BackendError(f"the exec channel refused the command: {refusal}")
        if stream != STARTED:
            raise BackendError(f"the exec channel answered frame {stream} before starting")
    except TimeoutError as exc:
        sock.close()
        raise BackendError(f"the exec channel did not answer in {ANSWER_TIMEOUT_S} s") from exc
    except (ChannelUnavailable, BackendError):
        sock.close()
        raise
    except OSError as exc:
        sock.close()
        raise ChannelUnavailable(f"the exec channel failed: {exc}") from exc
    return _ChannelExecution(sock)


def run_over_channel(runtime_name: str, address: str, argv: list[str]) -> ExecResult:
    """A short command of Quor's own (a start-up check) over the channel alone; raises
    ChannelUnavailable while nothing listens there yet."""
    token = channel_token(runtime_name)

    def start(argv, *, cwd, env, stdin) -> Execution:
        return start_over_channel(address, token, argv, cwd=cwd, env=env, stdin=stdin)

    return run_bounded(start, argv, cwd="/", env={}, timeout_s=10, output_limit=4096)


# Where each runtime's channel listens, by runtime name, as this process last saw it: a
# command then needs no call to the runtime's API. Dropped when the channel does not answer.
_addresses: dict[str, str] = {}


def remember(runtime_name: str, address: str) -> None:
    _addresses[runtime_name] = address


def remembered(runtime_name: str) -> str | None:
    return _addresses.get(runtime_name)


def starter(runtime_name: str, read_address: Callable[[], str | None], fallback: Start) -> Start:
    """A Start that uses the runtime's channel (at the remembered address, else at
    `read_address()`: None when the runtime does not run or has no channel) and
    `fallback`, the runtime's own exec, when there is none or nothing was started."""

    def start(argv, *, cwd, env, stdin) -> Execution:
        address = _addresses.get(runtime_name) or read_address()
        if address:
            _addresses[runtime_name] = address
            try:
                return start_over_channel(
                    address, channel_token(runtime_name), argv, cwd=cwd, env=env, stdin=stdin
                )
            except NothingListens:
                _addresses.pop(runtime_name, None)
                _restart(runtime_name, fallback)
            except ChannelUnavailable:
                _addresses.pop(runtime_name, None)
            except BackendError:
                _addresses.pop(runtime_name, None)
                raise
        return fallback(argv, cwd=cwd, env=env, stdin=stdin)

    return start


# When this process last started each runtime's channel again, by runtime name.
_restarted: dict[str, float] = {}
# Detached from the exec that starts it (its own session, no stdio of the exec's), as
# the entrypoint starts it; the runtime's environment holds the token.
_START_CHANNEL = ["sh", "-c", 'exec setsid -f "$@" </dev/null >/dev/null 2>&1', "sh"]


def _restart(runtime_name: str, fallback: Start) -> None:
    """Starts the runtime's channel again through its own exec, as the sandbox user."""
    now = time.monotonic()
    if now - _restarted.get(runtime_name, now - RESTART_EVERY_S) < RESTART_EVERY_S:
        return
    _restarted[runtime_name] = now
    try:
        started = run_bounded(
            fallback, [*_START_CHANNEL, *EXEC_CHANNEL], cwd="/", env={}, timeout_s=5,
            output_limit=1024,
        )  # fmt: skip
    except Exception as exc:  # best effort: the command itself still goes through the fallback
        logger.warning("could not start the exec channel of %s again: %s", runtime_name, exc)
        return
    if started.exit_code != 0:
        logger.warning(
            "starting the exec channel of %s again exited %s", runtime_name, started.exit_code
        )


class _ChannelExecution:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.status: int | None = None

    def send_stdin(self, chunks: Iterable[bytes]) -> None:
        self.sock.settimeout(STDIN_TIMEOUT_S)
        send_then_shut(self.sock, chunks)

    def output(self, read_timeout: float) -> Iterator[tuple[int, bytes]]:
        self.sock.settimeout(read_timeout)
        for stream, data in read_frames(self.sock):
            if stream == EXIT:
                self.status = struct.unpack(">l", data)[0]
                return
            yield stream, data

    def close(self) -> None:
        self.sock.close()

    def exit_code(self) -> int:
        if self.status is None:
            raise BackendError("the exec channel closed before the command's exit status")
        return self.status
