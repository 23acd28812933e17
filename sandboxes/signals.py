"""The one way a lower layer has something done above it ("after X, do Y") without
importing it: a Django signal, defined here and sent synchronously, in the sender's
thread and transaction. Receivers are connected by their package's AppConfig.ready()
(the `receivers` modules) and keep their own failures to themselves unless the sender's
step must fail with them. docs/architecture.md lists who sends and who receives what.
"""

from django.dispatch import Signal

# Sent by the runtime lifecycle (sandboxes.runtime) when a sandbox's runtime runs its
# workspace again after its processes were stopped or a fresh runtime was started: after
# a wake (`woke=True`: the managed area is empty), after a sleep that failed, after
# reconciliation found a half-done sleep running. Arguments: sandbox, woke.
runtime_ready = Signal()

# Sent by sandboxes.sessions inside the transaction that changes a session's status
# (the end of a turn, a cancel). Arguments: session, status.
session_status_changed = Signal()
