"""What only the sandbox image (deploy/sandbox/) knows: where its programs are and the
commands that drive them. Every backend runs the same image, so these argv lists work
through any backend's exec; nothing else in Quor spells a path inside the image."""

# The image's layout: the sandbox user, its workspace, each session's directory.
SANDBOX_UID = 1000
WORKSPACE = "/workspace"
SESSIONS_DIR = "/workspace/sessions"
# Skills and the User Library, written by Quor (sandboxes/library/managed.py); not in
# snapshots.
MANAGED_AREA = ".quor-managed"

# Quor's programs in the image (deploy/sandbox/runtime/, copied to /opt/quor): the file
# helper, which runs as the sandbox user and refuses symlinks and '..', and the agent.
FS_HELPER = ["python3", "/opt/quor/quor_fs.py"]
AGENT = ["python3", "/opt/quor/agent.py"]

# The agent's files in its session's directory (`.quor/` is the runtime's own): the
# message it answers, its output (the last turn's) and its exit status once it ended.
NEXT_MESSAGE = ".quor/next-message.txt"
AGENT_LOG = ".quor/agent.log"
AGENT_EXIT = ".quor/agent.exit"

# Beyond the turn's time limit, `timeout` gives the agent this long after SIGTERM.
AGENT_KILL_AFTER_S = 10


def agent_argv(session_id: str, session_dir: str, turn: int) -> list[str]:
    return [*AGENT, "--session-id", session_id, "--turn", str(turn), "--session-dir", session_dir]


def agent_pattern(session_id: str) -> str:
    """Matches the command line of any agent of the session, and nothing else: not
    `timeout` or a shell around it, not another session's agent."""
    return f"^{' '.join(AGENT)} --session-id {session_id} "


# Stops what is left of the session's earlier agents, then starts this one in a session
# of its own and returns: the exec ends in milliseconds. The inner shell writes the
# agent's output to its log and, when it ends, its exit status. Both scripts are fixed;
# the session's values are only arguments.
_START_AGENT = 'pkill -TERM -f "$1"; shift; exec setsid -f sh -c "$@"'
_RUN_AGENT = (
    'exec >"$0/' + AGENT_LOG + '" 2>&1 </dev/null; rm -f "$0/' + AGENT_EXIT + '"; '
    '"$@"; echo $? >"$0/' + AGENT_EXIT + '"'
)


def start_agent_argv(
    session_id: str, session_dir: str, turn: int, *, time_limit_s: int
) -> list[str]:
    """The agent reports its events (and heartbeats) to Quor itself; `timeout` stops it
    at the turn's time limit even if Quor never does."""
    return [
        "sh", "-c", _START_AGENT, "sh", agent_pattern(session_id), _RUN_AGENT, session_dir,
        "timeout", f"--kill-after={AGENT_KILL_AFTER_S}", f"{time_limit_s}s",
        *agent_argv(session_id, session_dir, turn),
    ]  # fmt: skip


def stop_agent_argv(session_id: str) -> list[str]:
    return ["pkill", "-TERM", "-f", agent_pattern(session_id)]


# Prints `running` while an agent of the session runs; else `exited STATUS` (or
# `exited unknown`) and the end of its log. The shell around an agent that just ended
# writes its status a moment later: it is waited for, up to a second (a runner killed
# with the agent never writes it).
_AGENT_STATE = (
    'if pgrep -f "$1" >/dev/null; then echo running; else '
    'i=0; while [ ! -s "$2/' + AGENT_EXIT + '" ] && [ $i -lt 20 ]; do '
    "sleep 0.05; i=$((i+1)); done; "
    'echo "exited $(cat "$2/' + AGENT_EXIT + '" 2>/dev/null || echo unknown)"; '
    'tail -c 400 "$2/' + AGENT_LOG + '" 2>/dev/null; fi'
)


def agent_state_argv(session_id: str, session_dir: str) -> list[str]:
    return ["sh", "-c", _AGENT_STATE, "sh", agent_pattern(session_id), session_dir]


# The runtime's own process, which keeps it alive: the image's CMD on Docker, the
# sandbox container's command (under tini) on Kubernetes.
KEEP_ALIVE = ["sleep", "infinity"]

# Quor's exec channel in the sandbox (deploy/sandbox/runtime/quor_execd.py), started by
# the entrypoint beside the keep-alive: where it listens, and its command line.
EXEC_CHANNEL_PORT = 47100
EXEC_CHANNEL = ["python3", "/opt/quor/quor_execd.py"]


def _oldest(argv: list[str]) -> str:
    return '$(pgrep -o -u "$(id -u)" -x -f "' + " ".join(argv) + '")'


# Every process of the sandbox user but the runtime's keep-alive and exec channel (the
# oldest of each: a copy the agent started is younger), PID 1 (tini on Kubernetes; the
# kernel ignores kills of it anyway), this command and its parent (`timeout`): a
# snapshot is then the workspace at one instant, as after a power cut (which programs
# like SQLite recover from), never files read while they are being changed.
_STOP_PROCESSES = (
    f"keep={_oldest(KEEP_ALIVE)}; channel={_oldest(EXEC_CHANNEL)}; "
    'for p in $(pgrep -u "$(id -u)"); do '
    '[ "$p" -ne "${keep:-0}" ] && [ "$p" -ne "${channel:-0}" ] && [ "$p" -ne 1 ] '
    '&& [ "$p" -ne $$ ] && [ "$p" -ne "$PPID" ] && kill -KILL "$p"; '
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


# A folder of a session downloaded as one archive: Quor's own entries of the session's
# directory (the runtime's `.quor/`, the links to the managed area, the agent's
# instructions that Quor writes again at every turn) are left out of it.
AGENT_INSTRUCTIONS = "AGENTS.md"
SESSION_OWN_ENTRIES = (".quor", "skills", "library", AGENT_INSTRUCTIONS)


def _excluded(folder: str) -> list[str]:
    return [f"--exclude=./{name}" for name in SESSION_OWN_ENTRIES] if folder == "." else []


def folder_size_argv(folder: str) -> list[str]:
    """Prints the bytes of the folder's files (apparent sizes, links not followed). A
    folder it cannot read is counted as empty (du then exits 1, its total still printed):
    tar cannot read it either."""
    return ["du", "-s", "-b", *_excluded(folder), "--", folder]


# tar's exit status 1 means "some files differ": a file changed while it was read (an app
# writing its log), which the archive still holds as read. A file or folder the sandbox
# user cannot read (mode 000) is left out with a warning (--ignore-failed-read) instead
# of failing the whole download. GNU tar (Debian's, in the image) has both options.
_ARCHIVE = 'tar "$@"; status=$?; [ "$status" -eq 1 ] && exit 0; exit "$status"'


def archive_folder_argv(folder: str) -> list[str]:
    """The folder (relative to the cwd; `.` for the whole session) as a .tar.gz on stdout.
    tar stores links as links and never follows them."""
    return [
        "sh", "-c", _ARCHIVE, "sh",
        "-c", "-z", "-f", "-", "--anchored", "--warning=no-file-changed", "--ignore-failed-read",
        *_excluded(folder), "--", folder,
    ]  # fmt: skip


# The session's terminal: a tmux server of its own per session (its socket name says
# which), so that a shell outlives the WebSocket that showed it and each server keeps the
# proxy identity of the session that started it. `new-session -A` attaches to the
# session's shell, starting it first if there is none; `-D` detaches any other client
# (a connection Quor already let go of), so the window takes this one's size. Passthrough
# lets the shell's command markers (sandboxes/terminal/markers.py) reach the client.
TERMINAL_NAME = "terminal"


def _terminal_server(session_id: str) -> list[str]:
    return ["tmux", "-u", "-L", f"quor-{session_id}"]


def terminal_attach_argv(session_id: str, cwd: str) -> list[str]:
    return [
        *_terminal_server(session_id), "new-session", "-A", "-D", "-s", TERMINAL_NAME, "-c", cwd,
        ";", "set-option", "status", "off", ";", "set-option", "-g", "allow-passthrough", "on",
    ]  # fmt: skip


def terminal_exists_argv(session_id: str) -> list[str]:
    """Exits 0 while the session's shell lives."""
    return [*_terminal_server(session_id), "has-session", "-t", TERMINAL_NAME]


def terminal_end_argv(session_id: str) -> list[str]:
    return [*_terminal_server(session_id), "kill-server"]
