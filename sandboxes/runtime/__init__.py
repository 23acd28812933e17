"""The runtime lifecycle of a user's sandbox: ensure, sleep and wake with snapshots,
reconciliation with the backend, exec and files. Built on sandboxes.backends; knows
nothing of sessions, the Library, approvals or web apps (it tells them through
sandboxes.signals)."""
