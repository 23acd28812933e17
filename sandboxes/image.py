"""What only the sandbox image (deploy/sandbox/) knows: where its programs are and the
commands that drive them. Every backend runs the same image, so these argv lists work
through any backend's exec; nothing else in Quor spells a path inside the image."""

from sandboxes.backends.base import MANAGED_AREA

AGENT = ["python3", "/opt/quor/agent.py"]

# The agent's log, in its session's directory (`.quor/` is the runtime's own).
AGENT_LOG = ".quor/agent.log"

# Beyond the turn's time limit, `timeout` gives the agent this long after SIGTERM.
AGENT_KILL_AFTER_S = 10


def agent_argv(session_id: str, session_dir: str) -> list[str]:
    return [*AGENT, "--session-id", session_id, "--session-dir", session_dir]


def start_agent_argv(session_id: str, session_dir: str, *, time_limit_s: int) -> list[str]:
    """Starts the agent in a session of its own and returns at once: the exec that runs
    this ends in milliseconds, and the agent reports its events (and heartbeats) to Quor
    itself. `timeout` stops it at the turn's time limit even if Quor never does. The
    script is fixed; the session's values are only arguments ("$0", "$@")."""
    return [
        "setsid", "-f", "sh", "-c", 'exec "$@" >>"$0/' + AGENT_LOG + '" 2>&1 </dev/null',
        session_dir,
        "timeout", f"--kill-after={AGENT_KILL_AFTER_S}", f"{time_limit_s}s",
        *agent_argv(session_id, session_dir),
    ]  # fmt: skip


def stop_agent_argv(session_id: str) -> list[str]:
    """SIGTERM to the session's agent: the pattern is anchored, so it matches the agent
    only, not `timeout` or this command's own wrapper."""
    return ["pkill", "-TERM", "-f", f"^{' '.join(AGENT)} --session-id {session_id} "]


# Every process of the sandbox user but the runtime's own (its oldest: the entrypoint's
# last command, which keeps the runtime alive) and this command's: a snapshot is then
# the workspace at one instant, as after a power cut (which programs like SQLite recover
# from), never files read while they are being changed.
_STOP_PROCESSES = (
    'keep=$(pgrep -o -u "$(id -u)"); for p in $(pgrep -u "$(id -u)"); do '
    '[ "$p" -ne "$keep" ] && [ "$p" -ne $$ ] && [ "$p" -ne "$PPID" ] && kill -KILL "$p"; '
    "done 2>/dev/null; exit 0"
)


def stop_processes_argv() -> list[str]:
    return ["sh", "-c", _STOP_PROCESSES]


def make_session_directory_argv(path: str) -> list[str]:
    """The session's directory, its runtime's `.quor/` and `attachments/`, private to the
    sandbox user."""
    return ["mkdir", "-p", "-m", "700", path, f"{path}/.quor", f"{path}/attachments"]


def link_managed_area_argv(managed_name: str, session_dir: str) -> list[str]:
    """`skills/` or `library/` in a session's directory: a link into the managed area,
    relative, so it holds wherever the workspace is mounted."""
    return ["ln", "-sfn", f"../../{MANAGED_AREA}/{managed_name}", f"{session_dir}/{managed_name}"]


def restart_web_app_argv(command: str, port: int) -> list[str]:
    """A web app's server started again as the agent's tool started it: in a session of
    its own, its output appended to the log the tool writes; returns at once."""
    script = 'setsid bash -lc "$1" >>"$2" 2>&1 </dev/null & exit 0'
    return ["bash", "-c", script, "bash", command, f".quor/webapp-{port}.log"]
